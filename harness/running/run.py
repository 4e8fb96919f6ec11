"""One run of the testbed: network up, jobs programmed, agents launched, switch state
sampled, everything torn down, results written.

``Run.execute`` is what ``qaina-bench up`` and ``qaina-bench run`` call. Whatever happens
(an error, Ctrl-C), the network, the switches and the agents are removed and what was
measured is written to ``results/<run-id>/``, marked incomplete if it did not finish.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ...hosts import kernels
from ...hosts.agent import AgentConfig
from ...hosts.fallback import FallbackConfig
from ...hosts.lanes import LaneFormat
from ..modes import congestion_asked, mode_of
from ...hosts.traces import find_trace
from ..results.resultset import ResultWriter
from ...topologies import LinkParams
from ..config import ConfigError, RunConfig
from .cpulimit import limit_problem
from .cpustat import CpuLedger
from .arrivals import Admission, SlotPool, arrival_offsets
from .capture import CaptureError, CapturePlan
from ..switches.jobs import Job, aggregator_ip, int_to_ip, partition_slots
from .linkloss import netem_available, nft_available
from .mncli import RunCLI
from .clustercheck import cluster_for, local_bmv2_check
from .cluster import SSH, host_servers
from .sshmux import Masters
from .linknames import check_names_free
from .network import Testbed
from .record import RunRecord, live_records, stale_records
from .rundir import RunFiles
from .exactsums import ExactSums
from .remotesampling import remote_samplers
from .runmeta import new_run_id, write_results
from .sampling import Sampler
from .progress import Progress
from ..trainscript import ScriptLauncher
from .starter import Starters
from .processes import (AgentProcess, LinkWatch, RunError, agent_env, deferred_signals,
                        end_on_termination, failed_text, ignored_signals, named_cause,
                        end_popens, unfinished)


def build_topology(cfg: RunConfig, netem: bool = True):
    """The run's topology; without netem, loss is left to nftables (see linkloss)."""
    net, work = cfg.network, cfg.workload
    # A host per job beyond the workers: its parameter server, or its fallback host.
    mode = mode_of(cfg)
    extra = mode.server is not None or (mode.in_switch and work.allocation == "shared")
    hosts = work.jobs * work.workers + (work.jobs if extra else 0)
    link = LinkParams(net.bw, net.delay, net.loss if netem else None)
    return cfg.topology().build(hosts, link)


class Run:
    starter: Starters | None = None  # what the agents are forked from, on every server

    def __init__(self, cfg: RunConfig, echo=print, hold: bool = False, cli: str | None = None):
        self.cfg = cfg
        self.echo = echo
        self.hold = hold  # keep the network up after the jobs until Ctrl-C or SIGTERM
        self.cli = cli  # Mininet's CLI "before" or "after" the jobs (harness/running/mncli.py)
        self.cli_session: RunCLI | None = None
        self.t_invoked = time.time()
        self.trace = cfg.check()
        #: --arrivals: each job's arrival after the start signal (s); None: all at once
        self.offsets = arrival_offsets(cfg.workload.arrivals, cfg.workload.jobs, cfg.workload.seed)
        self.admission: Admission | None = None
        tr = cfg.training
        self.trace_path = (None if tr.train or tr.train_script
                           else find_trace(tr.trace, tr.trace_dirs or None))
        if os.geteuid() != 0:
            raise ConfigError("qaina-bench up needs root (Mininet, veth, raw sockets): "
                              "run it with sudo")
        if shutil.which("mnexec") is None:
            raise ConfigError("mnexec not found: install Mininet (apt-get install mininet), "
                              "or run `qaina-bench doctor`")
        topo = build_topology(cfg)
        self.cluster = cluster_for(cfg.network.cluster, cfg.network.target, cfg.network.host_cpu,
                                   pcap=bool(cfg.output.pcap),
                                   script_topo=topo if cfg.training.train_script else None)
        self.netem = netem_available()
        if cfg.network.delay and not self.netem:
            raise ConfigError("--delay needs the kernel's netem qdisc, which this kernel "
                              "lacks (CONFIG_NET_SCH_NETEM); run without --delay, or on a "
                              "kernel with netem (e.g. the Vagrant VM)")
        if cfg.network.host_cpu and limit_problem():
            raise ConfigError(limit_problem())
        if cfg.network.loss and not self.netem and not nft_available():
            raise ConfigError("--loss needs netem or nftables: this kernel has no netem; "
                              "install nftables (apt-get install nftables)")
        if cfg.network.target == "bmv2":
            local_bmv2_check(self.cluster, topo)
        #: --pcap: the interfaces to capture and the tool, checked before anything starts
        self.capture = (CapturePlan.resolve(cfg.output.pcap, topo, cfg.output.pcap_size)
                        if cfg.output.pcap else None)
        busy = [r for r in live_records() if r.data["owner"] != os.getpid()]  # not ours
        if busy:
            raise ConfigError(f"run {busy[0].run_id} (pid {busy[0].data['owner']}) is still "
                              "running; wait for it or stop it first (one testbed at a time)")
        for rec in stale_records():  # a crashed run: remove exactly what it recorded
            removed = rec.remove()
            echo(f"run {rec.run_id} ended without tearing down; removed what it left: "
                 f"{'; '.join(removed) or 'nothing was left'}")
        check_names_free(cfg.network.topo, topo)
        cfg.output.run_id = cfg.output.run_id or new_run_id(cfg)
        self.dir = Path(cfg.output.results_dir) / cfg.output.run_id
        self.dir = self.dir.absolute() if self.cluster else self.dir  # the same path there
        if self.dir.exists():
            raise ConfigError(f"results directory {self.dir} exists; choose another --run-id")
        try:
            self.writer = ResultWriter(self.dir)
        except OSError as exc:
            raise ConfigError(f"cannot write results to {self.dir}: "
                              f"{exc.strerror or exc}; choose another --results-dir") from None
        self.record = RunRecord(cfg.output.run_id)
        self.files = RunFiles(self.cluster, self.writer.dir, self.record, self.writer.log_dir)
        self.sums = ExactSums(self.record)  # a replayed trace's exact sums, once per run
        self.masters = Masters(self.cluster.remote if self.cluster else [], self.record, SSH)
        self.testbed: Testbed | None = None
        self.agents: list[AgentProcess] = []
        self.mode = mode_of(cfg)  # the collective mode's data (hosts/collective.py)
        #: each job's server host: its mode's server, or its fallback host (shared pool)
        self.servers: list[str] = []
        self.server_procs: list[tuple] = []  # (name, popen, log) of the servers
        self.shared = self.mode.in_switch and cfg.workload.allocation == "shared"
        self.jobs: list[Job] = []
        self.status = "starting"
        self.signalled = False
        self.switch_program: dict = {"target": cfg.network.target}  # what ran the switches
        self.sampler: Sampler | None = None
        self.ledger = CpuLedger()  # CPU seconds of every process, agents' go to their end
        self.interfaces: dict[str, str] = {}  # switch interface -> node at its far end
        self.events: dict[str, float] = {"invoked": self.t_invoked}
        tr = cfg.training  # --train-script: the user's script runs instead of the agents
        self.script = (ScriptLauncher(tr.train_script, tr.train_args, self.dir)
                       if tr.train_script else None)

    # -- the run -------------------------------------------------------------------
    def execute(self) -> dict:
        cfg = self.cfg
        end_on_termination()
        deferred_signals.held_last = None
        self.writer.write_config(cfg.to_yaml())
        try:
            self.record.save()
            for server in self.masters.start():
                self.echo(f"  {server}: no shared ssh connection there, every command "
                          "connects on its own")
            self.files.open()
            self._bring_up()
            if self.cli == "before":
                self._enter_cli("before")
            self._launch_agents()
            self._monitor()
            self.status = "complete" if self._all_done() else self.status
            if self.cli == "after":
                self._enter_cli("after")
            if self.hold:
                self._hold()
        except KeyboardInterrupt:
            self.status = "interrupted"
            self.echo("\ninterrupted: tearing down, keeping what was measured")
        except Exception as exc:
            self.status = "failed"
            self.events["error"] = time.time()
            exc = named_cause(exc, self.testbed, self.starter)
            self.writer.note_error(f"{type(exc).__name__}: {exc}")
            raise exc from None
        finally:
            with ignored_signals() as held:  # another Ctrl-C or SIGTERM must not cut it short
                self._teardown()
                summary = write_results(self)
            #: Ctrl-C or SIGTERM came at any time, teardown included (`up` exits 130)
            self.signalled = (self.status == "interrupted" or held.caught is not None
                              or deferred_signals.held_last is not None)
        return summary

    def _bring_up(self):
        cfg, net = self.cfg, self.cfg.network
        topo = build_topology(cfg, self.netem)
        self.echo(f"run {cfg.output.run_id}: {net.topo} with {len(topo.switches())} switches, "
                  f"{len(topo.hosts())} hosts, target {net.target}")
        nft_loss = net.loss if net.loss and not self.netem else None
        if nft_loss:
            self.echo(f"  link loss {net.loss}% per direction by nftables (no netem here)")
        if net.host_cpu:
            self.echo(f"  every host limited to {net.host_cpu:g} cores of CPU time per second")
        self.sums.write(self.trace, cfg, self.echo)  # before any node: it may refuse
        self._start_starter(topo)
        self.testbed = Testbed(topo, net.target, self.writer.log_dir, self.record, nft_loss,
                               log_packets=cfg.output.switch_log, words=net.payload_words,
                               host_cpu=net.host_cpu, cluster=self.cluster,
                               host_tcp_cc=congestion_asked(cfg) if self.script else None)
        with deferred_signals():
            self.testbed.start()
        self.files.problems += self.testbed.stack_refusals  # warnings of the summary
        self._start_capture()
        self.switch_program = self.testbed.switch_program()
        #: where each embedded switch writes its ports' counters when it stops
        self.port_stats = {sw.name: sw.target.stats_path for sw in self.testbed.net.switches
                           if hasattr(sw.target, "stats_path")}
        self.interfaces = self.testbed.interface_peers()
        self.events["network_up"] = time.time()
        agg = topo.aggregator
        # The baselines hold no slots; with --arrivals a job gets its range when admitted;
        # shared jobs all range over the whole pool.
        work, net = cfg.workload, cfg.network
        static = self.mode.in_switch and self.offsets is None and not self.shared
        bases = (partition_slots([work.slots] * work.jobs, net.pool_slots) if static
                 else [0] * work.jobs)
        if self.mode.server is not None or self.shared:
            self.servers = topo.server_hosts(work.jobs, work.workers)
        job_hosts = topo.job_hosts(work.jobs, work.workers)
        for j, bits in enumerate(cfg.job_bits()):
            workers = [self.testbed.worker(k, h, agg) for k, h in enumerate(job_hosts[j])]
            fmt = LaneFormat(bits, work.workers, cfg.compression.pack)
            if self.shared:
                self.jobs.append(Job(j + 1, j, fmt, 0, net.pool_slots, workers, shared=True,
                                     upstream=self.testbed.fallback(self.servers[j], agg)))
            else:
                self.jobs.append(Job(j + 1, j, fmt, bases[j], work.slots, workers))
        self.aggregator = agg
        if self.mode.in_switch:
            self.testbed.program_aggregators(sorted({sw for job in self.jobs
                                                     for sw in self._placements(job)}))
            for job in self.jobs if self.offsets is None else []:
                self.testbed.install_job(self._placements(job))
        self.events["programmed"] = time.time()
        for job in self.jobs:
            slots = (f"slots {job.slot_base}..{job.slot_base + job.slot_count - 1}"
                     if self.offsets is None else
                     f"arrives at +{self.offsets[job.index]:g} s, {job.slot_count} slots")
            if self.shared:
                slots = (f"{work.slots} chunks in flight hashed onto the shared slots "
                         f"0..{net.pool_slots - 1}, fallback host {self.servers[job.index]}"
                         + ("" if self.offsets is None
                            else f", arrives at +{self.offsets[job.index]:g} s"))
            where = (f"{slots} on {agg}, {net.payload_words} words per packet"
                     if self.mode.in_switch else self.mode.description
                     + (f" on {self.servers[job.index]}" if self.servers else ""))
            self.echo(f"  job {job.job_id}: {job.fmt.describe()}, {where}, "
                      f"hosts {', '.join(w.host for w in job.workers)}")
            lower = [f"{sw} ({', '.join(w.host for w in j.workers)})"
                     for sw, j in self._placements(job).items() if j.upstream is not None]
            if self.mode.in_switch and lower and not self.shared:
                self.echo(f"    two levels: {'; '.join(lower)} sum below {agg}")

    def _start_capture(self):
        """--pcap: a capture on every chosen interface, before the jobs are programmed."""
        if self.capture is None:
            return
        with deferred_signals():
            try:
                self.capture.start(self.testbed.net, self.dir / "pcap", self.writer.log_dir,
                                   self.record)
            except CaptureError as exc:
                raise RunError(str(exc)) from None
        self.echo(f"  capturing {len(self.capture.interfaces)} interface(s) with "
                  f"{self.capture.tool} into {self.dir / 'pcap'}")

    def _placements(self, job: Job) -> dict:
        """Switch -> the job as that switch holds it (``Testbed.placements``)."""
        return self.testbed.placements(job, self.aggregator, self.cfg.network.levels)

    def _senders(self, job: Job) -> dict[str, tuple[str, int]]:
        """Host -> (the switch it sends to, its worker index there)."""
        if not self.mode.in_switch:
            return {w.host: (self.aggregator, w.index) for w in job.workers}
        return {w.host: (sw, w.index) for sw, j in self._placements(job).items()
                for w in j.workers if w.host not in self.testbed.conns}

    def _launch_agents(self):
        cfg = self.cfg
        starter = self.starter  # loading while the network came up
        if starter is None:  # compiled once here: the agents then load them from the cache
            kernels.warm()
        else:  # (Ctrl-C works while it waits: nothing is started meanwhile)
            starter.wait_loaded()
        ids = self.testbed.device_ids
        go = self.writer.dir / "agents" / "go"
        self._launch_servers()
        # With --arrivals each job has a start file of its own, written at its admission.
        self.start_files = {job.job_id: go if self.offsets is None else
                            go.with_name(f"go-j{job.job_id}") for job in self.jobs}
        where = {w.host: getattr(self.testbed.host(w.host), "server_key", None)
                 for job in self.jobs for w in job.workers}  # the trace set there
        traces = self.files.send_inputs(self.trace_path, set(where.values()), self.echo)
        self.sums.send(self.files, set(where.values()))
        configured = []
        for job in self.jobs:
            senders = self._senders(job)
            for w in job.workers:
                host = w.host
                switch, wire_worker = senders[host]
                name = f"j{job.job_id}w{w.index}"
                acfg = AgentConfig(
                    run=cfg, job_id=job.job_id, worker=w.index, bits=job.fmt.bits,
                    trace=traces.get(where[host], str(self.trace_path or "")),
                    exact_sums=self.sums.there(where[host]),
                    aggregator=aggregator_ip(ids[switch]),
                    wire_worker=wire_worker, slot_base=job.slot_base,
                    slots=cfg.workload.slots if self.shared else job.slot_count,
                    shared_slots=job.slot_count if self.shared else 0,
                    output=str(self.writer.dir / "agents" / f"{name}.jsonl"),
                    start_file=str(self.start_files[job.job_id]),
                    start_timeout=(120.0 if self.offsets is None
                                   else max(120.0, cfg.output.timeout)),
                    ring_peers=[int_to_ip(x.ip) for x in job.workers],
                    ps_address=(self.testbed.host(self.servers[job.index]).IP()
                                if self.mode.server else None))
                path = self.writer.dir / "agents" / f"{name}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                acfg.save(path)
                self.files.send(path, wait=False)  # every configuration on its way at once
                configured.append((job, w, name, path, acfg))
        self.files.settle()
        for job, w, name, path, acfg in configured:
            argv, env, log = self._agent_command(job, w, name, path)
            with deferred_signals(), open(log, "wb") as out:
                popen = self.testbed.start_process(w.host, argv, out, log, env,
                                                   f"agent {name} on {w.host}", wait=False,
                                                   starter=starter)
                self.agents.append(AgentProcess(job.job_id, w.index, w.host, acfg, popen, log))
        with deferred_signals():
            self.testbed.started()  # the remote ones, started at once
        self._await_agents()
        for p in self._processes():
            self.ledger.watch(p["name"], p["component"], p["pid"], p["job"])
        self.ledger.begin()
        # The first samples are taken before any agent sends: a short run's link bytes
        # are counted from before its first packet.
        processes, remote = remote_samplers(self.testbed, {p["name"]: p["pid"] for p in
                                                           self._processes()},
                                            self.writer.dir, self.record)
        self.sampler = Sampler(self.writer, self.testbed.conns,
                               self.aggregator if self.mode.in_switch else None, self.jobs,
                               self.testbed.switch_interfaces(), processes,
                               slot_interval=cfg.output.sample_interval, remote=remote)
        self.sampler.begin()
        self.events["agents_go"] = time.time()
        if self.offsets is None:
            self.files.write(go)
        else:
            pool = SlotPool(cfg.network.pool_slots)
            # Shared jobs hold no slots of their own: they are admitted on arrival.
            slots = [job.slot_count if self.mode.in_switch and not self.shared else 0
                     for job in self.jobs]
            self.admission = Admission(pool, slots, self.offsets, self.events["agents_go"],
                                       self._admit, self._release)
            self.admission.step(time.time())

    def _start_starter(self, topo):
        """Start the processes the agents will be forked from (``starter.py``; they
        load them, compiling the kernels where the disk cache lacks them, while the
        network comes up), on the servers ``topo`` places hosts on. Not for a
        training script: each is a process of its own (the servers of a cluster run
        its copy, sent to them now)."""
        if self.script is not None:
            self.files.send(self.script.copy)
            return
        with deferred_signals():
            self.starter = Starters(self.writer.log_dir, self.record, self.cluster,
                                    name=f"qaina-bench-starter-{self.cfg.output.run_id}"[:100],
                                    servers=host_servers(self.cluster, topo))
            self.starter.start()

    def _await_agents(self):
        """Until every agent has loaded its trace (a script: PyTorch too) and is ready."""
        wait = min(60 if self.script is None else self.script.START_WAIT,
                   self.cfg.output.timeout)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._check_agents()
            if all(any(r.get("type") == "start" for r in a.records()) for a in self.agents):
                return
            time.sleep(0.02)
        waiting = [f"j{a.job}w{a.worker}" for a in self.agents
                   if not any(r.get("type") == "start" for r in a.records())]
        how = f" ({self.mode.connect_note})" if self.mode.connect_note else ""
        raise RunError(f"agents {', '.join(waiting[:8])}{' ...' if len(waiting) > 8 else ''} "
                       f"did not start within {wait:g} s{how}; see {self.writer.log_dir}")

    def _agent_command(self, job: Job, worker, name: str, path: Path):
        """argv, environment and log of a worker's process: its agent, or with
        --train-script the user's script (``harness/trainscript.py``)."""
        if self.script is None:
            return ([sys.executable, "-m", "qaina_bench.hosts.agent", str(path)], agent_env(),
                    self.writer.log_dir / f"agent-{name}.log")
        node = self.testbed.host(worker.host)
        env = self.script.env(agent_env(), path, worker.index, len(job.workers),
                              int_to_ip(job.workers[0].ip), node.defaultIntf().name)
        remote = getattr(node, "server_key", None) is not None  # the copy, on another server
        return self.script.argv(remote), env, self.writer.log_dir / self.script.log_name(name)

    def _admit(self, index: int, base: int):
        """--arrivals: job ``index`` gets slots ``base..``, its entries, its start signal
        (the start file holds its slot base)."""
        job = self.jobs[index]
        job.slot_base = base
        if self.mode.in_switch:
            self.testbed.install_job(self._placements(job))
        self.files.write(self.start_files[job.job_id], json.dumps({"slot_base": base}))

    def _release(self, index: int):
        if self.mode.in_switch:
            self.testbed.remove_job(self._placements(self.jobs[index]))

    def _admit_and_release(self):
        """--arrivals: jobs whose agents all ended leave, arrived jobs are admitted
        (first those that fit now: freeing a leaving job's copies takes BMv2 a second)."""
        now = time.time()
        self.admission.step(now)
        for a in self.admission.arrivals:
            if a.admitted is not None and a.left is None:
                job_id = self.jobs[a.job].job_id
                if all(self.ledger.poll(x.popen) == 0 for x in self.agents if x.job == job_id):
                    self.admission.leave(a.job, now)
        self.admission.step(time.time())

    def _launch_servers(self):
        """A mode with a server (--mode ps): its server process per job, on the job's
        server host; --allocation shared: one fallback host process per job there."""
        if self.shared:
            self._launch_fallbacks()
            return
        server = self.mode.server
        for job, host in zip(self.jobs, self.servers):
            name = f"{server.short}{job.job_id}"
            log = self.writer.log_dir / f"{name}.log"
            with deferred_signals(), open(log, "wb") as out:
                popen = self.testbed.start_process(
                    host, [sys.executable, *server.argv(job.fmt.workers,
                                                        congestion_asked(self.cfg))], out, log,
                    agent_env(), f"{server.label} {name} on {host}")
                self.server_procs.append((name, popen, log))

    def _launch_fallbacks(self):
        ids = self.testbed.device_ids
        for job, host in zip(self.jobs, self.servers):
            name = f"fallback{job.job_id}"
            path = self.writer.dir / "agents" / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            fcfg = FallbackConfig(job.job_id, job.fmt.workers, self.cfg.network.payload_words,
                                  aggregator_ip(ids[self.aggregator]),
                                  str(self.writer.dir / "agents" / f"{name}-stats.json"))
            self.files.write(path, json.dumps(asdict(fcfg)))
            log = self.writer.log_dir / f"{name}.log"
            with deferred_signals(), open(log, "wb") as out:
                popen = self.testbed.start_process(
                    host, [sys.executable, "-m", "qaina_bench.hosts.fallback", str(path)],
                    out, log, agent_env(), f"fallback host {name} on {host}")
                self.server_procs.append((name, popen, log))

    def _processes(self) -> list[dict]:
        """Every process the run started for the jobs: name, component, the job it
        serves (None: all of them) and PID."""
        out = [{"name": f"switch {sw.name}", "component": "switches", "job": None,
                "pid": sw.target.pid} for sw in self.testbed.net.switches]
        out += [{"name": f"agent j{a.job}w{a.worker}", "component": "agents", "job": a.job,
                 "pid": a.popen.pid} for a in self.agents]
        kind, component = (("fallback host", "fallback") if self.shared else
                           (self.mode.server.label, self.mode.server.short) if self.mode.server
                           else ("", ""))
        out += [{"name": f"{kind} {name}", "component": component, "job": job.job_id,
                 "pid": popen.pid} for job, (name, popen, _) in zip(self.jobs, self.server_procs)]
        return out

    def _check_agents(self):
        """RunError, with the end of its log, when a server or an agent failed; the
        StarterError of a starter that ended (its agents' ends are then unknown)."""
        if self.starter is not None and (death := self.starter.death()) is not None:
            raise death
        kind = "fallback host" if self.shared else getattr(self.mode.server, "label", "")
        procs = [(f"{kind} {name}", popen, log) for name, popen, log in self.server_procs]
        procs += [(f"agent j{a.job}w{a.worker} on {a.host}", a.popen, a.log) for a in self.agents]
        for what, popen, log in procs:
            if self.ledger.poll(popen) not in (None, 0):
                raise RunError(failed_text(what, self.ledger.poll(popen), log))

    def _all_done(self) -> bool:
        return all(self.ledger.poll(a.popen) == 0 for a in self.agents)

    def _monitor(self):
        """Show progress until the agents are done; the sampler measures meanwhile."""
        t0 = time.time()
        jobs = sorted({a.job for a in self.agents})
        total = self.cfg.workload.iterations * len(jobs)  # a job's: all its workers'
        progress = Progress(self.echo)
        self.links = LinkWatch(self.testbed, t0, progress.say)
        try:
            while True:
                # Read first, so that the pass that ends the loop has checked every agent
                # and let every job whose agents all ended leave (exits land meanwhile).
                ended = all(self.ledger.poll(a.popen) is not None for a in self.agents)
                self._check_agents()
                if self.sampler.error:
                    raise RunError(self.sampler.error)
                if self.admission is not None:
                    self._admit_and_release()
                done = sum(min(a.iterations_done() for a in self.agents if a.job == j)
                           for j in jobs)
                line = f"  iterations {done}/{total}  ({time.time() - t0:5.1f} s)"
                if self.admission is not None and self.admission.waiting:
                    line += f", {self.admission.waiting} job(s) not admitted yet"
                progress.show(line)
                self.links.check(time.time())
                if ended:
                    break
                if time.time() - t0 > self.cfg.output.timeout:
                    self.status = "timeout"
                    self.echo(f"\nrun exceeded --timeout {self.cfg.output.timeout:.0f} s"
                              + unfinished(self.agents, self.ledger, self.testbed,
                                           self.starter))
                    break
                # Jobs waiting to arrive or for slots are admitted within 10 ms.
                time.sleep(0.01 if self.admission is not None and self.admission.waiting
                           else 0.1)
        finally:
            self.sampler.stop()
            self.ledger.end()  # before anything is stopped
            progress.end()  # the progress line ends, whatever ended the loop

    def _hold(self):
        """Keep the network and the switches up, as the jobs left them, until Ctrl-C or
        SIGTERM; the run then ends as usual (its status is the jobs')."""
        self._stop_agents()  # after a timeout some still run: the state stays put
        self.events["held"] = time.time()
        names = [sw.name + (" (aggregator)" if sw.name == self.aggregator else "")
                 for sw in self.testbed.net.switches]
        try:  # a Ctrl-C as soon as the line shows ends the held run too
            self.echo(f"jobs ended ({self.status}); the network stays up until Ctrl-C. "
                      "p4runtime-shell "
                      f"on a switch: qaina-bench shell SWITCH --run {self.cfg.output.run_id}  "
                      f"(switches: {', '.join(names)})")
            self.testbed.watch(self.echo)  # says so if a switch dies meanwhile
        except KeyboardInterrupt:
            self.echo("\nending the held run")

    def _enter_cli(self, when: str):
        """``--cli``: Mininet's CLI until the user leaves it; SIGTERM there ends the run
        (before the jobs: interrupted; after: as the jobs ended, exit status 130)."""
        if when == "after":
            self._stop_agents()
        self.events[f"cli_{when}"] = time.time()
        self.cli_session = RunCLI(self.testbed, self.record, self.echo)
        if self.cli_session.run(when, self):
            deferred_signals.held_last = signal.SIGTERM
            if when == "before":
                raise KeyboardInterrupt

    def _stop_agents(self):
        end_popens([a.popen for a in self.agents] + [p for _, p, _ in self.server_procs])

    def _teardown(self):
        if self.sampler is not None:  # stopped before _monitor (stopping twice is fine)
            self.sampler.stop()
        self.ledger.end()
        self._stop_agents()
        if self.starter is not None:  # after its forks: it stops any left
            self.starter.close()
        self.sums.remove()
        if self.cli_session is not None:  # what the user started from Mininet's CLI
            for problem in self.cli_session.stop_by_hand()[1]:
                self.writer.note_error(f"teardown: {problem}")
        if self.capture is not None:  # the files are written out before the links go
            self.capture.stop(self.dir / "pcap")
        self.files.close()  # the servers' followers end before what is left is checked
        if self.testbed is not None:
            try:
                self.testbed.stop(said=self._teardown_problem)
            except Exception as exc:
                self._teardown_problem(f"{exc}; `qaina-bench clean` removes what is left")
                self._gather()
                self.masters.stop()
                return
        self._gather()
        self.masters.stop()  # last: what is left on the servers was checked through them
        self.record.close()

    def _teardown_problem(self, line: str):
        self.writer.note_error(f"teardown: {line}")
        self.echo(f"teardown: {line}")

    def _gather(self):
        """Every server's part of the run's directory back here (``rundir.py``)."""
        for problem in self.files.gather():
            self.writer.note_error(problem)
            self.echo(problem)
