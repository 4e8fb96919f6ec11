"""GradiVeQ: linear PCA compression of gradient slices (Yu et al., NeurIPS 2018).

``GradiVeQ`` compresses one vector slice by slice with one basis; ``LayeredGradiVeQ``
is what a job uses, as the paper does: every layer with at least ``k`` slices gets a
basis of its own (slices never cross a layer boundary), smaller layers travel as
they are; ``GradiVeQSchedule`` says which iterations are aggregated exactly to fit
and refresh the bases.

The flattened gradient is cut into slices of ``d`` consecutive elements (the last one
zero-padded). An orthonormal ``d x k`` basis ``U`` holds the top ``k`` principal
directions of slices seen in a few early iterations; a slice ``g`` travels as its ``k``
coefficients ``U^T g`` and comes back as ``U c``.

The compression is linear, so the sum of the workers' compressed gradients is the
compressed sum: the coefficients can be aggregated by ring all-reduce or by the switch
without decompressing. Quantized with QSGD (:mod:`.quantize`), they ride the same lanes
as any other gradient values.

The directions are those of the uncentred second moment of the slices. (Centring
would keep linearity too, with the receiver adding n times the mean back; it is not
done here.) Every worker must use the same
``U``: fit it on data all workers hold (e.g. the exact aggregates of the first
iterations, which an uncompressed all-reduce gives everyone) or fit once and hand the
basis around (:meth:`GradiVeQ.from_basis`).
"""

from __future__ import annotations

import numpy as np


class GradiVeQ:
    """A slice-wise PCA compressor: ``d`` elements per slice, ``k`` coefficients out."""

    def __init__(self, d: int = 64, k: int = 8):
        if d < 1 or not 1 <= k <= d:
            raise ValueError(f"need 1 <= k <= d, got d={d} k={k}")
        self.d = int(d)
        self.k = int(k)
        self.basis: np.ndarray | None = None  # d x k, orthonormal columns, float32
        self.captured_energy: float | None = None  # of the fitted slices

    @classmethod
    def from_basis(cls, basis: np.ndarray) -> "GradiVeQ":
        """A compressor with a given ``d x k`` basis (orthonormal columns)."""
        basis = np.asarray(basis, dtype=np.float32)
        if basis.ndim != 2:
            raise ValueError(f"basis must be d x k, got shape {basis.shape}")
        compressor = cls(*basis.shape)
        gram = basis.astype(np.float64).T @ basis
        if not np.allclose(gram, np.eye(compressor.k), atol=1e-4):
            raise ValueError("basis columns are not orthonormal")
        compressor.basis = basis
        return compressor

    def __repr__(self):
        state = "fitted" if self.fitted else "not fitted"
        return f"GradiVeQ(d={self.d}, k={self.k}, {state})"

    @property
    def fitted(self) -> bool:
        return self.basis is not None

    @property
    def compression_ratio(self) -> float:
        """Gradient elements per coefficient sent: ``d / k`` (padding aside)."""
        return self.d / self.k

    def slice_count(self, elements: int) -> int:
        return -(-elements // self.d)

    def compressed_size(self, elements: int) -> int:
        """Coefficients that a gradient of ``elements`` values compresses to."""
        return self.slice_count(elements) * self.k

    def slices(self, grad: np.ndarray) -> np.ndarray:
        """A flattened gradient as rows of ``d`` elements, the last row zero-padded."""
        g = np.asarray(grad).reshape(-1)
        rows = self.slice_count(len(g))
        if rows * self.d == len(g):
            return g.reshape(rows, self.d)
        padded = np.zeros(rows * self.d, dtype=g.dtype)
        padded[: len(g)] = g
        return padded.reshape(rows, self.d)

    def fit(self, slices: np.ndarray) -> "GradiVeQ":
        """Fit the basis to stacked slices (``S x d``), e.g. of several workers' gradients."""
        slices = np.asarray(slices, dtype=np.float64)
        if slices.ndim != 2 or slices.shape[1] != self.d:
            raise ValueError(f"slices must have shape (S, {self.d}), got {slices.shape}")
        if len(slices) < self.k:
            raise ValueError(f"{len(slices)} slices cannot span {self.k} directions")
        _, singular, vt = np.linalg.svd(slices, full_matrices=False)
        energy = singular**2
        total = energy.sum()
        self.captured_energy = float(energy[: self.k].sum() / total) if total > 0 else 1.0
        self.basis = np.ascontiguousarray(vt[: self.k].T, dtype=np.float32)
        return self

    def fit_gradients(self, gradients) -> "GradiVeQ":
        """Fit to the slices of several flattened gradients."""
        return self.fit(np.concatenate([self.slices(g) for g in gradients]))

    def compress(self, grad: np.ndarray) -> np.ndarray:
        """The ``slice_count * k`` float32 coefficients of a flattened gradient."""
        basis = self._basis()
        return (self.slices(np.asarray(grad, dtype=np.float32)) @ basis).reshape(-1)

    def decompress(self, coeffs: np.ndarray, elements: int | None = None) -> np.ndarray:
        """The float32 gradient (first ``elements`` values; all slices if None)."""
        basis = self._basis()
        coeffs = np.asarray(coeffs, dtype=np.float32).reshape(-1)
        if len(coeffs) % self.k:
            raise ValueError(f"{len(coeffs)} coefficients are not whole slices of {self.k}")
        grad = (coeffs.reshape(-1, self.k) @ basis.T).reshape(-1)
        if elements is None:
            return grad
        if not 0 <= elements <= len(grad):
            raise ValueError(f"{len(coeffs)} coefficients hold at most {len(grad)} elements")
        return grad[:elements]

    def relative_error(self, grad: np.ndarray) -> float:
        """``|g - decompress(compress(g))| / |g|``: what the basis cannot express."""
        g = np.asarray(grad, dtype=np.float32).reshape(-1)
        norm = np.linalg.norm(g.astype(np.float64))
        if norm == 0:
            return 0.0
        error = self.decompress(self.compress(g), len(g)).astype(np.float64) - g
        return float(np.linalg.norm(error) / norm)

    def _basis(self) -> np.ndarray:
        if self.basis is None:
            raise RuntimeError("GradiVeQ has no basis yet: call fit() first")
        return self.basis


class LayeredGradiVeQ:
    """GradiVeQ per layer. ``layers`` are ``(name, size)`` in gradient order; a layer
    of at least ``k`` slices of ``d`` elements is compressed with a basis fitted to its
    own slices, the others travel as they are. The compressed vector is, layer by
    layer, the coefficients or the raw values; it is linear in the gradient."""

    def __init__(self, layers, d: int = 64, k: int = 8):
        self.layers = [(str(name), int(size)) for name, size in layers]
        self.d, self.k = int(d), int(k)
        self.parts = [GradiVeQ(d, k) if -(-size // d) >= k else None
                      for _, size in self.layers]
        self.elements = sum(size for _, size in self.layers)
        self.fits = 0  # how often the bases were fitted
        self.energy: float | None = None  # share of the fit data's energy the bases keep

    @property
    def fitted(self) -> bool:
        return self.fits > 0

    def compressed_size(self) -> int:
        return sum(p.compressed_size(size) if p is not None else size
                   for p, (_, size) in zip(self.parts, self.layers))

    def _split(self, vector: np.ndarray):
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        if len(vector) != self.elements:
            raise ValueError(f"a gradient of {len(vector)} elements, the layers hold "
                             f"{self.elements}")
        start = 0
        for part, (_, size) in zip(self.parts, self.layers):
            yield part, vector[start:start + size]
            start += size

    def fit(self, aggregates) -> "LayeredGradiVeQ":
        """Fit every compressed layer's basis to its slices of ``aggregates`` (exact
        sums of gradients, which every worker of the job holds alike)."""
        layers = [list(self._split(a)) for a in aggregates]
        kept = total = 0.0
        for j, part in enumerate(self.parts):
            if part is None:
                continue
            slices = np.concatenate([part.slices(layer[j][1]) for layer in layers])
            part.fit(slices)
            energy = float((slices.astype(np.float64) ** 2).sum())
            kept += part.captured_energy * energy
            total += energy
        self.energy = kept / total if total > 0 else 1.0
        self.fits += 1
        return self

    def compress(self, gradient: np.ndarray) -> np.ndarray:
        return np.concatenate([part.compress(g) if part is not None else g
                               for part, g in self._split(gradient)])

    def decompress(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        out, start = [], 0
        for part, (_, size) in zip(self.parts, self.layers):
            n = part.compressed_size(size) if part is not None else size
            chunk = values[start:start + n]
            out.append(part.decompress(chunk, size) if part is not None else chunk)
            start += n
        if start != len(values):
            raise ValueError(f"{len(values)} values, the compressed layers hold {start}")
        return np.concatenate(out)

    def projection_error(self, gradient: np.ndarray) -> float:
        """``|g - decompress(compress(g))| / |g|``: what the bases cannot express."""
        g = np.asarray(gradient, dtype=np.float32).reshape(-1)
        norm = np.linalg.norm(g.astype(np.float64))
        if norm == 0:
            return 0.0
        back = self.decompress(self.compress(g)).astype(np.float64)
        return float(np.linalg.norm(back - g) / norm)


class GradiVeQSchedule:
    """Which iterations a job aggregates exactly (uncompressed, at 32 bits) to fit the
    bases, and which compressed: the first ``fit`` iterations are exact; then, with
    ``refresh`` = R > 0, every (R + 1)-th iteration is exact again and the bases are
    refitted on the last ``fit`` exact aggregates."""

    def __init__(self, fit: int = 1, refresh: int = 0):
        if fit < 1 or refresh < 0:
            raise ValueError(f"GradiVeQ needs fit >= 1 and refresh >= 0, got {fit}, {refresh}")
        self.fit, self.refresh = int(fit), int(refresh)

    def exact(self, i: int) -> bool:
        """Whether iteration ``i`` is aggregated uncompressed at 32 bits."""
        if i < self.fit:
            return True
        return self.refresh > 0 and (i - self.fit) % (self.refresh + 1) == self.refresh


class GradiVeQCompressor:
    """GradiVeQ as a job's compressor (``--compress gradiveq``, the interface in
    hosts/compression.py): per-layer bases, exact iterations by ``GradiVeQSchedule``,
    fitted on the last ``fit`` exact aggregates."""

    def __init__(self, layers, d: int = 64, k: int = 8, fit: int = 1, refresh: int = 0, **_):
        self.layered = LayeredGradiVeQ(layers, d, k)
        self.schedule = GradiVeQSchedule(fit, refresh)
        self.window: list[np.ndarray] = []  # the exact aggregates the bases fit

    @property
    def fitted(self) -> bool:
        return self.layered.fitted

    def exact(self, i: int) -> bool:
        return self.schedule.exact(i)

    def compress(self, gradient: np.ndarray) -> np.ndarray:
        return self.layered.compress(gradient)

    def decompress(self, values: np.ndarray) -> np.ndarray:
        return self.layered.decompress(values)

    def learn(self, aggregate: np.ndarray, i: int) -> None:
        """Keep the last ``fit`` exact aggregates; once there are that many, fit."""
        self.window = (self.window + [aggregate])[-self.schedule.fit:]
        if i + 1 >= self.schedule.fit:
            self.layered.fit(self.window)

    def metrics(self, exact_sum: np.ndarray | None) -> dict:
        """What the bases cannot express of the exact sum, and the fit data's energy
        they keep (once fitted)."""
        if not self.fitted:
            return {}
        return dict(gvq_projection_error=(None if exact_sum is None else
                                          self.layered.projection_error(exact_sum)),
                    gvq_energy=self.layered.energy)
