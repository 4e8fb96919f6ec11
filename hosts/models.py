"""The models trained on the digits: a numpy MLP (always there), and with PyTorch a
small CNN and a ResNet-18-layout network of 10^6 - 10^7 parameters, behind one API:
``layers``, ``elements``, ``init_params``, ``loss_and_grad``, ``loss``, ``accuracy``,
``describe``.
"""

from __future__ import annotations

import numpy as np

from .traces import Layer, TraceError

TORCH_HINT = ("install the CPU build of PyTorch: pip install torch --index-url "
              "https://download.pytorch.org/whl/cpu (plain `pip install torch` takes a CUDA "
              "build of several GB on Linux)")


class NumpyMLP:
    """A fully connected ReLU network with softmax cross-entropy, in numpy.

    Parameters live in one flat vector in layer order ``fc1.weight`` (out x in),
    ``fc1.bias``, ``fc2.weight``, ...; computations run in that vector's dtype.
    """

    kind = "mlp"

    def __init__(self, sizes=(64, 128, 64, 10)):
        self.sizes = tuple(int(s) for s in sizes)
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"layer sizes {sizes}: need at least input and output")
        self.layers = []
        for j, (fan_in, fan_out) in enumerate(zip(self.sizes, self.sizes[1:]), start=1):
            self.layers += [Layer(f"fc{j}.weight", (fan_out, fan_in)),
                            Layer(f"fc{j}.bias", (fan_out,))]
        self.elements = sum(layer.size for layer in self.layers)

    def describe(self) -> str:
        return "-".join(map(str, self.sizes)) + " fully connected, ReLU, softmax cross-entropy"

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """He-initialised weights, zero biases, float32."""
        parts = []
        for fan_in, fan_out in zip(self.sizes, self.sizes[1:]):
            parts.append(rng.standard_normal((fan_out, fan_in)).ravel() * np.sqrt(2.0 / fan_in))
            parts.append(np.zeros(fan_out))
        return np.concatenate(parts).astype(np.float32)

    def _unflatten(self, params):
        views, start = [], 0
        for layer in self.layers:
            views.append(params[start:start + layer.size].reshape(layer.shape))
            start += layer.size
        return views[0::2], views[1::2]

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The network's outputs for the rows of ``x``."""
        weights, biases = self._unflatten(params)
        h = np.asarray(x, dtype=params.dtype)
        for j, (w, b) in enumerate(zip(weights, biases)):
            h = h @ w.T + b
            if j < len(weights) - 1:
                h = np.maximum(h, 0)
        return h

    def loss(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Mean cross-entropy over the batch."""
        return float(_cross_entropy(self.logits(params, x), y)[0])

    def accuracy(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Fraction of rows classified right."""
        return float(np.mean(self.logits(params, x).argmax(axis=1) == y))

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray):
        """Mean cross-entropy over the batch and its gradient (flat, params' dtype)."""
        weights, biases = self._unflatten(params)
        activations = [np.asarray(x, dtype=params.dtype)]
        for j, (w, b) in enumerate(zip(weights, biases)):
            z = activations[-1] @ w.T + b
            activations.append(np.maximum(z, 0) if j < len(weights) - 1 else z)
        loss, delta = _cross_entropy(activations[-1], y)  # delta = dLoss/dlogits
        grads = [None] * (2 * len(weights))
        for j in range(len(weights) - 1, -1, -1):
            grads[2 * j] = delta.T @ activations[j]
            grads[2 * j + 1] = delta.sum(axis=0)
            if j:
                delta = (delta @ weights[j]) * (activations[j] > 0)
        return float(loss), np.concatenate([g.ravel() for g in grads]).astype(params.dtype)


def _cross_entropy(logits: np.ndarray, y: np.ndarray):
    """Mean softmax cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_prob = shifted - log_norm
    rows = np.arange(len(y))
    loss = -log_prob[rows, y].mean()
    delta = np.exp(log_prob)
    delta[rows, y] -= 1
    return loss, delta / len(y)


class TorchModel:
    """A PyTorch network behind the models' API: flat float32 parameter vectors in
    ``named_parameters`` order, gradients the same. Subclasses build ``self.net`` in
    ``build(torch)`` and set ``side``: the 8x8 digits are upsampled (nearest) to
    ``side`` x ``side``. The parameters are PyTorch's default initialisation, drawn
    from the seed alone."""

    kind = "torch"
    side = 8

    def __init__(self, seed: int = 0):
        try:
            import torch
        except ImportError as exc:
            raise TraceError(f"the {self.kind} model needs PyTorch: {TORCH_HINT}") from exc
        self.torch = torch
        torch.set_num_threads(1)  # agents share two cores with the switches
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            self.net = self.build(torch)
        finally:
            torch.random.set_rng_state(generator_state)
        self.layers = [Layer(name, tuple(p.shape)) for name, p in self.net.named_parameters()]
        self.elements = sum(layer.size for layer in self.layers)

    def build(self, torch):
        raise NotImplementedError

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """PyTorch's default initialisation, made from the seed given to the constructor."""
        vector = self.torch.nn.utils.parameters_to_vector(self.net.parameters())
        return vector.detach().numpy().astype(np.float32)

    def _load(self, params: np.ndarray) -> None:
        self.torch.nn.utils.vector_to_parameters(
            self.torch.from_numpy(np.ascontiguousarray(params, dtype=np.float32)),
            self.net.parameters())

    def _images(self, x: np.ndarray):
        images = self.torch.from_numpy(np.asarray(x, dtype=np.float32).reshape(-1, 1, 8, 8))
        if self.side != 8:
            images = self.torch.nn.functional.interpolate(images, size=self.side)
        return images

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        self._load(params)
        with self.torch.no_grad():
            return np.concatenate([self.net(self._images(x[i:i + 256])).numpy()
                                   for i in range(0, len(x), 256)])

    def loss(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        return float(_cross_entropy(self.logits(params, x).astype(np.float64), y)[0])

    def accuracy(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(self.logits(params, x).argmax(axis=1) == y))

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray):
        """Mean cross-entropy over the batch and its flat float32 gradient."""
        torch = self.torch
        self._load(params)
        self.net.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(self.net(self._images(x)),
                                                 torch.from_numpy(np.asarray(y, np.int64)))
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in self.net.parameters()])
        return loss.item(), grad.numpy().astype(np.float32)


class TorchCNN(TorchModel):
    """A small convolutional net for the 8x8 digits: conv 1->8 (3x3, pad 1), ReLU,
    2x2 max-pool, conv 8->16 (3x3, pad 1), ReLU, 2x2 max-pool, linear 64->10."""

    kind = "cnn"

    def build(self, torch):
        net = torch.nn.Sequential()
        net.add_module("conv1", torch.nn.Conv2d(1, 8, 3, padding=1))
        net.add_module("relu1", torch.nn.ReLU())
        net.add_module("pool1", torch.nn.MaxPool2d(2))
        net.add_module("conv2", torch.nn.Conv2d(8, 16, 3, padding=1))
        net.add_module("relu2", torch.nn.ReLU())
        net.add_module("pool2", torch.nn.MaxPool2d(2))
        net.add_module("flatten", torch.nn.Flatten())
        net.add_module("fc", torch.nn.Linear(64, 10))
        return net

    def describe(self) -> str:
        return ("conv 1-8 3x3, ReLU, maxpool 2, conv 8-16 3x3, ReLU, maxpool 2, "
                "linear 64-10, softmax cross-entropy")


class TorchResNet(TorchModel):
    """ResNet-18's layout (a 3x3 stem, four stages of two basic blocks, widths w, 2w,
    4w, 8w, global average pooling, a linear head) on the digits upsampled to 32x32,
    with GroupNorm instead of BatchNorm, so that the parameters are all there is to
    a model (no running statistics that would differ from worker to worker).
    ``width`` = 64 is ResNet-18's 11 M parameters; the default 24 has 1.6 M."""

    kind = "resnet"
    side = 32

    def __init__(self, seed: int = 0, width: int = 24):
        self.width = int(width)
        super().__init__(seed)

    def build(self, torch):
        nn, w = torch.nn, self.width

        def norm(channels):
            return nn.GroupNorm(min(8, channels), channels)

        class Block(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.norm1 = norm(cout)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.norm2 = norm(cout)
                self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           norm(cout)) if stride != 1 or cin != cout else None)

            def forward(self, x):
                out = torch.relu(self.norm1(self.conv1(x)))
                out = self.norm2(self.conv2(out))
                return torch.relu(out + (x if self.skip is None else self.skip(x)))

        layers = [nn.Conv2d(1, w, 3, 1, 1, bias=False), norm(w), nn.ReLU()]
        cin = w
        for stage, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
            for block in range(2):
                layers.append(Block(cin, cout, 2 if stage and not block else 1))
                cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
        return nn.Sequential(*layers)

    def describe(self) -> str:
        return (f"ResNet-18 layout, widths {self.width}-{2 * self.width}-{4 * self.width}-"
                f"{8 * self.width}, GroupNorm, on the digits upsampled to 32x32, softmax "
                "cross-entropy")


MODELS = ("mlp", "cnn", "resnet")
#: the most parameters a model may have: its gradient is what each worker sends per
#: iteration, and a trace keeps one per worker and iteration
MAX_PARAMETERS = 50_000_000


def parameter_count(model: str, hidden=(128, 64), width: int = 24) -> int | None:
    """The parameters of ``make_model(model, hidden, width=width)`` without building it:
    exact for the mlp, about for the resnet (11.2 M at width 64), None for the cnn
    (fixed)."""
    if model == "mlp":
        sizes = (64, *hidden, 10)
        return sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
    if model == "resnet":
        return 2730 * width * width
    return None


def check_shape(model: str, hidden=(128, 64), width: int = 24) -> None:
    """TraceError unless the model's layers are positive and it has at most
    ``MAX_PARAMETERS`` parameters."""
    if model == "mlp" and (not hidden or min(hidden) < 1):
        raise TraceError(f"--hidden {','.join(map(str, hidden))}: give positive layer sizes")
    if model == "resnet" and width < 1:
        raise TraceError(f"--width {width}: give a positive width")
    size = parameter_count(model, hidden, width)
    if size is not None and size > MAX_PARAMETERS:
        what = "--hidden" if model == "mlp" else "--width"
        about = "about " if model == "resnet" else ""
        raise TraceError(f"{what}: a {model} of {about}{size:,} parameters is more than this "
                         f"testbed's {MAX_PARAMETERS:,}; give smaller layers")


def make_model(model: str, hidden=(128, 64), seed: int = 0, width: int = 24):
    """A model to train: ``"mlp"`` (numpy), ``"cnn"`` or ``"resnet"`` (PyTorch)."""
    if model in MODELS:
        check_shape(model, hidden, width)
    if model == "mlp":
        return NumpyMLP((64, *hidden, 10))
    if model == "cnn":
        return TorchCNN(seed)
    if model == "resnet":
        return TorchResNet(seed, width)
    raise TraceError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
