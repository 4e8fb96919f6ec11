"""p4runtime-shell as a test drives it, run by tests/test_shell.py with the python of
the shell's own venv (``make shell-tool``): connects to a switch, reads a table and a
counter, tries to write a table entry, and prints what it saw as one JSON line."""

import argparse
import json

import p4runtime_sh.shell as sh
from p4runtime_sh.context import P4Type

JOB = dict(job_index=1, n_workers=4, slot_base=0, slot_count=8, mcast_grp=2, bits=4,
           lane_width=6, lanes=5, shared=0)


def insert_job(job_id: int) -> str:
    """"ok", or the error the switch answered."""
    te = sh.TableEntry("MyIngress.job_table")(action="MyIngress.set_job")
    te.match["hdr.qaina.job_id"] = str(job_id)
    for name, value in JOB.items():
        te.action[name] = str(value)
    try:
        te.insert()
    except Exception as exc:  # the shell raises gRPC's or its own error types
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpc-addr", required=True)
    ap.add_argument("--device-id", type=int, default=1)
    ap.add_argument("--election-id", required=True, help="HIGH,LOW")
    ap.add_argument("--write-job", type=int, help="insert this job id into job_table")
    args = ap.parse_args()
    election = tuple(int(x) for x in args.election_id.split(","))
    sh.setup(device_id=args.device_id, grpc_addr=args.grpc_addr, election_id=election,
             verbose=False)
    try:
        out = {"tables": sorted(name for name, _ in sh.context.get_objs(P4Type.table)),
               "aggregator_addr": sorted(e.match["hdr.ipv4.dstAddr"].exact.value.hex()
                                         for e in sh.TableEntry("MyIngress.aggregator_addr")
                                         .read()),
               "drops": {e.index: e.packet_count
                         for e in sh.CounterEntry("MyIngress.drops").read()}}
        if args.write_job is not None:
            out["write"] = insert_job(args.write_job)
            out["jobs"] = sorted(e.match["hdr.qaina.job_id"].exact.value.hex()
                                 for e in sh.TableEntry("MyIngress.job_table").read())
    finally:
        sh.teardown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
