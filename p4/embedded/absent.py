"""Reads of entity kinds ``qaina.p4`` has none of (meters, direct resources, action
profiles, value sets, digests, externs): a wildcard gives nothing, as the spec's
"Wildcard Reads" asks of a Read of the whole forwarding state; one named by id is
refused."""

from __future__ import annotations

from .tables import PipelineError

#: entity kinds the program has none of, and the field that names one: a wildcard Read
#: of them gives nothing (spec, "Wildcard Reads"), a Read of one is refused
ABSENT = {"meter_entry": "meter_id", "direct_counter_entry": "table_entry",
          "direct_meter_entry": "table_entry", "action_profile_member": "action_profile_id",
          "action_profile_group": "action_profile_id", "value_set_entry": "value_set_id",
          "digest_entry": "digest_id", "extern_entry": "extern_type_id"}


def read_absent(kind: str):
    """The reader of an entity kind ``qaina.p4`` has none of."""
    if kind not in ABSENT:
        raise PipelineError("UNIMPLEMENTED", f"reading {kind} is not supported")

    def read(pipeline, query, out):
        named = getattr(query, ABSENT[kind])
        if kind.startswith("direct_"):
            named = named.table_id
        if named:
            raise PipelineError("INVALID_ARGUMENT", f"{kind} of {ABSENT[kind]} {named}: "
                                f"qaina.p4 has no {kind.removesuffix('_entry')}s")
    return read
