"""The P4 tables of the embedded switch as the control plane writes them.

A ``Table`` holds entries keyed by match values, each an action and its parameters,
checked against the P4Info the way BMv2 checks them; every change tells the
table's listeners (the pipeline rebuilds its lookup structures from it).
"""

from __future__ import annotations

from ..p4info import ActionInfo, TableInfo


class PipelineError(Exception):
    """A control-plane request the pipeline refuses; ``code`` is a gRPC status name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Table:
    """One P4 table: entries keyed by match values, an action and its parameters.

    A key is a tuple with one item per match field: an int for exact fields, a
    ``(value, prefix_len)`` pair for LPM fields. An action is ``(action_name, params)``
    with the parameters as a tuple of ints in P4Info order.
    """

    def __init__(self, info: TableInfo, actions: dict[int, ActionInfo], default):
        self.info = info
        self.name = info.name
        self.actions = {aid: actions[aid] for aid in info.action_ids}
        self.entries: dict[tuple, tuple] = {}
        #: an entry's controller_metadata and metadata, as written (returned on reads)
        self.cookies: dict[tuple, tuple[int, bytes]] = {}
        self.default = default
        self.initial_default = default  # what the program sets
        self.listeners = []
        self.deferred = False  # within a Write batch: listeners told once, at its end
        self._dirty = False

    def _check_action(self, action_id: int, params: tuple):
        if action_id not in self.actions:
            raise PipelineError("INVALID_ARGUMENT",
                                f"action id {action_id} is not an action of {self.name}")
        action = self.actions[action_id]
        if len(params) != len(action.params):
            raise PipelineError("INVALID_ARGUMENT", f"{action.name} takes "
                                f"{len(action.params)} parameters, got {len(params)}")
        for value, p in zip(params, action.params):
            if value >> p.bitwidth:
                raise PipelineError("INVALID_ARGUMENT",
                                    f"{action.name}: {p.name}={value} exceeds {p.bitwidth} bits")
        return action.name, tuple(params)

    def _check_key(self, key: tuple):
        if len(key) != len(self.info.match_fields):
            raise PipelineError("INVALID_ARGUMENT", f"{self.name} has "
                                f"{len(self.info.match_fields)} match fields, got {len(key)}")
        for value, mf in zip(key, self.info.match_fields):
            if mf.match_type == "LPM":
                v, plen = value
                if not 0 <= plen <= mf.bitwidth or v >> mf.bitwidth:
                    raise PipelineError("INVALID_ARGUMENT", f"{mf.name}: bad prefix {v}/{plen}")
                if v & ((1 << (mf.bitwidth - plen)) - 1):
                    raise PipelineError("INVALID_ARGUMENT",
                                        f"{mf.name}: bits beyond the /{plen} prefix are set")
            elif value >> mf.bitwidth:
                raise PipelineError("INVALID_ARGUMENT",
                                    f"{mf.name}={value} exceeds {mf.bitwidth} bits")

    def insert(self, key: tuple, action_id: int, params: tuple):
        self._check_key(key)
        action = self._check_action(action_id, params)
        if key in self.entries:
            raise PipelineError("ALREADY_EXISTS", f"{self.name}: entry {key} exists")
        if len(self.entries) >= self.info.size:
            raise PipelineError("RESOURCE_EXHAUSTED", f"{self.name} is full ({self.info.size})")
        self.entries[key] = action
        self._changed()

    def modify(self, key: tuple, action_id: int, params: tuple):
        self._check_key(key)
        action = self._check_action(action_id, params)
        if key not in self.entries:
            raise PipelineError("NOT_FOUND", f"{self.name}: no entry {key}")
        self.entries[key] = action
        self._changed()

    def delete(self, key: tuple):
        self._check_key(key)
        if self.entries.pop(key, None) is None:
            raise PipelineError("NOT_FOUND", f"{self.name}: no entry {key}")
        self.cookies.pop(key, None)
        self._changed()

    def set_default(self, action_id: int, params: tuple):
        self.default = self._check_action(action_id, params)
        self._changed()

    def reset_default(self):
        """The program's own default action again (a MODIFY of the default entry
        without an action)."""
        self.default = self.initial_default
        self._changed()

    def set_cookie(self, key: tuple, controller_metadata: int, metadata: bytes):
        """What the control plane keeps with an entry (the switch only returns it)."""
        if controller_metadata or metadata:
            self.cookies[key] = (controller_metadata, metadata)
        else:
            self.cookies.pop(key, None)

    def clear(self):
        self.entries.clear()
        self.cookies.clear()
        self._changed()

    def defer(self):
        """Tell the listeners of changes once, at ``flush()`` (a batch of updates)."""
        self.deferred = True

    def flush(self):
        self.deferred = False
        if self._dirty:
            self._changed()

    def _changed(self):
        self._dirty = self.deferred
        if self.deferred:
            return
        for listener in self.listeners:
            listener(self)


#: ``upstream_table``'s fields where a job has no entry: the metadata's zeros
NO_UPSTREAM = (0, 0, bytes(6), 0)


def upstream_of(action: str, params: tuple) -> tuple | None:
    """What ``upstream_table``'s action sets: (port, address, MAC, worker), or None
    where it leaves ``up_port`` at 0 (NoAction, or port 0)."""
    if action != "MyIngress.set_upstream" or params[0] == 0:
        return None
    return params[0], params[1], params[2].to_bytes(6, "big"), params[3]


def rewrite_of(action: str, params: tuple) -> tuple | None:
    """What ``result_rewrite``'s action sets: (MAC, address, worker), or None (NoAction)."""
    if action != "MyEgress.to_worker":
        return None
    return params[0].to_bytes(6, "big"), params[1].to_bytes(4, "big"), params[2]
