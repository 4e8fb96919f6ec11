/*
 * qaina.p4: quantization-aware in-network aggregation (P4_16, v1model, BMv2).
 *
 * Workers send contributions (Ethernet/IPv4/UDP dport QAINA_UDP_PORT/QAINA/payload of
 * QAINA_WORDS 32-bit words) to the aggregator address of their job's switch. The
 * switch adds the payload words of all workers of a job slot-wise with plain wrapping
 * 32-bit addition (the workers packed several low-bit lanes per word, so no carry
 * crosses a lane), and multicasts the sum to every worker when the last contribution
 * arrives. Each slot has two
 * copies (hdr.qaina.ver) so that a retransmitted contribution for a completed slot is
 * answered with the stored result (SwitchML's shadow-copy scheme, see p4/README.md).
 * A job of the shared allocation (set_job's shared = 1, ATP-style) instead places
 * the chunk (job, seq) on a copy of its shared region when the copy is free or
 * already holds it, and sends anything else to its fallback host (upstream_table)
 * with FLAG_FALLBACK; the copy is held until the fallback host's result comes back.
 * All other IPv4 traffic is routed by ipv4_lpm.
 *
 * Before either, every IPv4 packet passes source address validation: a port the
 * control plane guards (port_guard) admits only the source addresses it listed for
 * it (source_guard), and a RESULT is routed only from a source on a port where the
 * control plane declared that aggregator upstream (allow_source(results = 1)).
 *
 * The P4Info of this program is kept next to it as qaina.p4info.txtpb; every table,
 * action, counter and register carries an @id so that P4Info is exactly what p4c emits.
 *
 * This file is the 32-word build. p4/program.py renders the 64-, 128- and 256-word
 * builds from it: QAINA_WORDS and what follows from it (POOL_WORDS, the two length
 * constants, payload_h and ALL_WORDS) are all that differ.
 */
#include <core.p4>
#include <v1model.p4>

#define QAINA_WORDS 32
#define POOL_SLOTS 1024                 /* slots in the shared pool (per copy)       */
#define POOL_COPIES 2048                /* POOL_SLOTS * 2 copies                      */
#define POOL_WORDS 65536                /* POOL_COPIES * QAINA_WORDS                  */
#define MAX_JOBS 16
#define MAX_WORKERS 32                  /* agg_seen has one bit per worker            */
#define DROP_REASONS 16

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> QAINA_UDP_PORT = 20801;
const bit<16> QAINA_UDP_LEN = 148;      /* 8 UDP + 12 QAINA + 4 * QAINA_WORDS bytes   */
const bit<16> QAINA_IPV4_LEN = 168;     /* 20 IPv4 + QAINA_UDP_LEN                    */
const bit<8>  FLAG_RESULT = 0x01;
const bit<8>  FLAG_RETX = 0x02;
const bit<8>  FLAG_FALLBACK = 0x04;     /* shared: a single sent on to the fallback host */
const bit<8>  FLAG_FLUSH = 0x08;        /* shared: the fallback host asks for a partial   */
const bit<8>  FALLBACK_PARTIAL = 254;   /* shared: worker index of that partial sum      */
const bit<8>  RESULT_TTL = 64;

/* Indexes of MyIngress.drops: why a packet was dropped. */
const bit<32> DROP_NOT_IPV4 = 0;        /* not IPv4, or truncated before the IPv4 end */
const bit<32> DROP_NO_ROUTE = 1;        /* no ipv4_lpm entry                          */
const bit<32> DROP_MALFORMED = 2;       /* for the aggregator, not a whole QAINA pkt  */
const bit<32> DROP_BAD_FLAGS = 3;       /* result flag on a contribution, ver > 1     */
const bit<32> DROP_UNKNOWN_JOB = 4;     /* job_id not in job_table                    */
const bit<32> DROP_NON_MEMBER = 5;      /* source address not a worker of the job     */
const bit<32> DROP_BAD_WORKER = 6;      /* worker index not the member's, or >= n     */
const bit<32> DROP_BAD_SLOT = 7;        /* slot outside the job's range or the pool   */
const bit<32> DROP_DUPLICATE = 8;       /* contribution already counted, slot pending */
const bit<32> DROP_BAD_JOB = 9;         /* job entry out of range: job_index, n_workers */
const bit<32> DROP_WRONG_PORT = 10;     /* member's address on another ingress port   */
const bit<32> DROP_SPOOFED_SOURCE = 11; /* source address not allowed on a guarded port */
const bit<32> DROP_FORGED_RESULT = 12;  /* RESULT where no aggregator lies upstream    */
const bit<32> DROP_STALE_RESULT = 13;   /* upstream result no copy is waiting for     */
const bit<32> DROP_TTL_EXPIRED = 14;    /* to be routed with a TTL of 0 or 1          */
@noWarn("unused")
const bit<32> DROP_INTERNAL = 15;       /* embedded switch only: processing failed    */

typedef bit<9>  port_t;
typedef bit<48> mac_t;
typedef bit<32> ip4_t;

header ethernet_t {
    mac_t   dstAddr;
    mac_t   srcAddr;
    bit<16> etherType;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> totalLen;
    bit<16> identification;
    bit<3>  flags;
    bit<13> fragOffset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdrChecksum;
    ip4_t   srcAddr;
    ip4_t   dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length_;
    bit<16> checksum;
}

/* The same as QAINA_FIELDS in p4/header.py, which tests/test_header.py checks. */
header qaina_h {
    bit<16> job_id;
    bit<8> worker;
    bit<8> flags;
    bit<16> slot;
    bit<8> ver;
    bit<8> exp;
    bit<32> seq;
}

header payload_h {
    bit<32> w0;  bit<32> w1;  bit<32> w2;  bit<32> w3;
    bit<32> w4;  bit<32> w5;  bit<32> w6;  bit<32> w7;
    bit<32> w8;  bit<32> w9;  bit<32> w10; bit<32> w11;
    bit<32> w12; bit<32> w13; bit<32> w14; bit<32> w15;
    bit<32> w16; bit<32> w17; bit<32> w18; bit<32> w19;
    bit<32> w20; bit<32> w21; bit<32> w22; bit<32> w23;
    bit<32> w24; bit<32> w25; bit<32> w26; bit<32> w27;
    bit<32> w28; bit<32> w29; bit<32> w30; bit<32> w31;
}

struct headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    qaina_h    qaina;
    payload_h  payload;
}

struct metadata_t {
    bit<8>  job_index;      /* index of the job's counters                          */
    bit<8>  n_workers;
    bit<16> slot_base;
    bit<16> slot_count;
    bit<16> mcast_grp;
    bit<8>  bits;           /* number format: informational for the data plane      */
    bit<8>  lane_width;
    bit<8>  lanes;
    bit<8>  member_worker;  /* worker index of the source address                   */
    port_t  member_port;    /* the port the member's packets arrive on              */
    bit<1>  is_result;      /* leaves as an aggregation result (counted at egress)  */
    bit<1>  results_in;     /* RESULTs from this source may enter on this port      */
    port_t  up_port;        /* two levels: the port to the job's upper aggregator   */
    ip4_t   up_addr;        /* ... its address and MAC,                              */
    mac_t   up_mac;
    bit<8>  up_worker;      /* ... and this switch's worker index there (0: top)     */
    bit<8>  shared;         /* 1: the job's chunks share the pool (ATP-style)        */
}

/* ---------------------------------------------------------------- parser */
parser MyParser(packet_in packet, out headers_t hdr, inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        /* Only whole datagrams: no options, not a fragment (MF clear, offset 0). */
        transition select(hdr.ipv4.ihl, hdr.ipv4.flags, hdr.ipv4.fragOffset,
                          hdr.ipv4.protocol) {
            (4w5, 3w0 &&& 3w1, 13w0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            QAINA_UDP_PORT: parse_qaina;
            default: accept;
        }
    }
    state parse_qaina {
        packet.extract(hdr.qaina);
        packet.extract(hdr.payload);
        transition accept;
    }
}

control MyVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

/* ---------------------------------------------------------------- ingress */
/* Register access for one payload word at pool index `base`. */
#define STORE_WORD(i) agg_sum.write(base + i, hdr.payload.w##i);
#define ADD_WORD(i) agg_sum.read(word, base + i); word = word + hdr.payload.w##i; \
    agg_sum.write(base + i, word); hdr.payload.w##i = word;
#define LOAD_WORD(i) agg_sum.read(hdr.payload.w##i, base + i);
#define ALL_WORDS(OP) \
    OP(0)  OP(1)  OP(2)  OP(3)  OP(4)  OP(5)  OP(6)  OP(7)  \
    OP(8)  OP(9)  OP(10) OP(11) OP(12) OP(13) OP(14) OP(15) \
    OP(16) OP(17) OP(18) OP(19) OP(20) OP(21) OP(22) OP(23) \
    OP(24) OP(25) OP(26) OP(27) OP(28) OP(29) OP(30) OP(31)

control MyIngress(inout headers_t hdr, inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {

    /* Aggregation state: the shared slot pool, two copies per slot. */
    @id(1) register<bit<32>>(POOL_WORDS) agg_sum;     /* word sums                  */
    @id(2) register<bit<32>>(POOL_COPIES) agg_seen;   /* bitmap of contributors     */
    @id(3) register<bit<8>>(POOL_COPIES) agg_count;   /* contributions mod n        */
    @id(4) register<bit<8>>(POOL_COPIES) agg_exp;     /* max scale exponent         */
    @id(5) register<bit<16>>(POOL_COPIES) agg_owner;  /* job_id of the copy's use   */
    @id(6) register<bit<8>>(POOL_COPIES) agg_final;   /* two levels: result is in   */
    @id(7) register<bit<32>>(POOL_COPIES) agg_seq;    /* seq of the copy's use      */

    /* What the harness samples over P4Runtime, per job index (or drop reason). */
    @id(1) counter(MAX_JOBS, CounterType.packets_and_bytes) slots_opened;
    @id(2) counter(MAX_JOBS, CounterType.packets_and_bytes) slots_closed;
    @id(3) counter(MAX_JOBS, CounterType.packets_and_bytes) agg_packets;
    @id(4) counter(MAX_JOBS, CounterType.packets_and_bytes) retx_answered;
    @id(5) counter(DROP_REASONS, CounterType.packets_and_bytes) drops;
    @id(7) counter(MAX_JOBS, CounterType.packets_and_bytes) fallback_packets;

    @hidden action drop_for(bit<32> reason) {
        drops.count(reason);
        mark_to_drop(standard_metadata);
    }

    @id(1) action forward(port_t port) {
        standard_metadata.egress_spec = port;
        hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        /* The checksum after the decrement (RFC 1624, eqn. 3: the 16-bit word
           ttl.protocol fell by 0x0100). MyComputeChecksum recomputes it where the
           header has no options; with options, this is the checksum that leaves. */
        bit<32> sum = (bit<32>)(~hdr.ipv4.hdrChecksum) + 32w0xFEFF;
        hdr.ipv4.hdrChecksum = ~(sum[15:0] + (bit<16>)sum[31:16]);
    }

    @id(2) action no_route() {
        drop_for(DROP_NO_ROUTE);
    }

    @id(3) action accept_qaina() { }

    @id(4) action set_job(bit<8> job_index, bit<8> n_workers, bit<16> slot_base,
                          bit<16> slot_count, bit<16> mcast_grp, bit<8> bits,
                          bit<8> lane_width, bit<8> lanes, bit<8> shared) {
        meta.job_index = job_index;
        meta.n_workers = n_workers;
        meta.slot_base = slot_base;
        meta.slot_count = slot_count;
        meta.mcast_grp = mcast_grp;
        meta.bits = bits;
        meta.lane_width = lane_width;
        meta.lanes = lanes;
        meta.shared = shared;
    }

    @id(5) action set_member(bit<8> worker, port_t port) {
        meta.member_worker = worker;
        meta.member_port = port;
    }

    @id(7) action guard_port() { }

    @id(8) action allow_source(bit<1> results) {
        meta.results_in = results;
    }

    @id(9) action set_upstream(port_t port, ip4_t addr, mac_t mac, bit<8> worker) {
        meta.up_port = port;
        meta.up_addr = addr;
        meta.up_mac = mac;
        meta.up_worker = worker;
    }

    @id(1) table ipv4_lpm {
        key = { hdr.ipv4.dstAddr: lpm; }
        actions = { forward; no_route; }
        default_action = no_route();
        size = 1024;
    }

    /* The addresses this switch aggregates for. */
    @id(2) table aggregator_addr {
        key = { hdr.ipv4.dstAddr: exact; }
        actions = { accept_qaina; NoAction; }
        default_action = NoAction();
        size = 16;
    }

    @id(3) table job_table {
        key = { hdr.qaina.job_id: exact; }
        actions = { set_job; NoAction; }
        default_action = NoAction();
        size = MAX_JOBS;
    }

    @id(4) table member_table {
        key = {
            hdr.qaina.job_id: exact;
            hdr.ipv4.srcAddr: exact;
        }
        actions = { set_member; NoAction; }
        default_action = NoAction();
        size = 512;
    }

    /* Source address validation: the ports whose sources are checked ... */
    @id(6) table port_guard {
        key = { standard_metadata.ingress_port: exact; }
        actions = { guard_port; NoAction; }
        default_action = NoAction();
        size = 512;
    }

    /* ... and the sources each port admits; results = 1 where the source is an
       aggregator upstream of the port, whose results may come in through it. */
    @id(7) table source_guard {
        key = {
            standard_metadata.ingress_port: exact;
            hdr.ipv4.srcAddr: exact;
        }
        actions = { allow_source; NoAction; }
        default_action = NoAction();
        size = 4096;
    }

    /* Two-level aggregation: a job with an entry here is aggregated on this switch
       over the workers below it, and the sum goes up to the job's upper aggregator
       as this switch's contribution; the upper aggregator's result comes back down. */
    @id(8) table upstream_table {
        key = { hdr.qaina.job_id: exact; }
        actions = { set_upstream; NoAction; }
        default_action = NoAction();
        size = MAX_JOBS;
    }

    /* The sum of the workers below goes up as this switch's contribution. */
    @hidden action partial_to_upstream() {
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = meta.up_mac;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = meta.up_addr;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.checksum = 0;
        hdr.qaina.worker = meta.up_worker;
        standard_metadata.egress_spec = meta.up_port;
    }

    /* Shared allocation: a worker's contribution goes on, unchanged but for the
       addresses and FLAG_FALLBACK, to the job's fallback host (the upstream). */
    @hidden action single_to_fallback() {
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = meta.up_mac;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = meta.up_addr;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.checksum = 0;
        hdr.qaina.flags = hdr.qaina.flags | FLAG_FALLBACK;
        standard_metadata.egress_spec = meta.up_port;
    }

    /* A result leaves from the aggregator's address, with a fresh TTL. */
    @hidden action result_from_aggregator() {
        hdr.qaina.flags = FLAG_RESULT;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.checksum = 0;
        meta.is_result = 1;
    }

    @hidden action result_to_all() {
        result_from_aggregator();
        hdr.ethernet.srcAddr = hdr.ethernet.dstAddr;
        hdr.ipv4.srcAddr = hdr.ipv4.dstAddr;
        standard_metadata.mcast_grp = meta.mcast_grp;
    }

    @hidden action result_to_sender() {
        result_from_aggregator();
        mac_t mac = hdr.ethernet.dstAddr;
        hdr.ethernet.dstAddr = hdr.ethernet.srcAddr;
        hdr.ethernet.srcAddr = mac;
        ip4_t ip = hdr.ipv4.dstAddr;
        hdr.ipv4.dstAddr = hdr.ipv4.srcAddr;
        hdr.ipv4.srcAddr = ip;
        hdr.qaina.flags = FLAG_RESULT | FLAG_RETX;
        standard_metadata.egress_spec = standard_metadata.ingress_port;
    }

    apply {
        if (!hdr.ipv4.isValid()) {
            drop_for(DROP_NOT_IPV4);
            return;
        }
        /* Any entry admits the source (NoAction too, with results_in left at 0). */
        if (!source_guard.apply().hit) {
            if (port_guard.apply().hit) {
                drop_for(DROP_SPOOFED_SOURCE);
                return;
            }
        }
        if (!aggregator_addr.apply().hit) {
            /* Only an aggregator's replication makes a result: one arriving where the
               control plane declared no aggregator upstream is forged. */
            if (hdr.qaina.isValid() && (hdr.qaina.flags & FLAG_RESULT) != 0
                    && meta.results_in == 0) {
                drop_for(DROP_FORGED_RESULT);
                return;
            }
            if (hdr.ipv4.ttl <= 1) {  /* it would leave with 0, or wrap to 255 */
                drop_for(DROP_TTL_EXPIRED);
                return;
            }
            ipv4_lpm.apply();
            return;
        }
        /* Addressed to this aggregator: check everything before touching a register. */
        if (!hdr.payload.isValid() || hdr.ipv4.totalLen != QAINA_IPV4_LEN
                || hdr.udp.length_ != QAINA_UDP_LEN) {
            drop_for(DROP_MALFORMED);
            return;
        }
        /* A result comes in only from the job's upper aggregator, on its port. */
        upstream_table.apply();
        bool from_upstream = (hdr.qaina.flags & FLAG_RESULT) != 0;
        if ((from_upstream && (meta.up_port == 0
                               || standard_metadata.ingress_port != meta.up_port
                               || hdr.ipv4.srcAddr != meta.up_addr))
                || hdr.qaina.ver > 1) {
            drop_for(DROP_BAD_FLAGS);
            return;
        }
        if (!job_table.apply().hit) {
            drop_for(DROP_UNKNOWN_JOB);
            return;
        }
        /* The control plane may write any value the P4Info allows: never index a
           counter past MAX_JOBS, never shift a worker bit past the 32-bit bitmap. */
        if (meta.job_index >= MAX_JOBS || meta.n_workers > MAX_WORKERS) {
            drop_for(DROP_BAD_JOB);
            return;
        }
        if (!from_upstream) {
            if (!member_table.apply().hit) {
                drop_for(DROP_NON_MEMBER);
                return;
            }
            if (standard_metadata.ingress_port != meta.member_port) {
                drop_for(DROP_WRONG_PORT);
                return;
            }
            if (hdr.qaina.worker != meta.member_worker
                    || hdr.qaina.worker >= meta.n_workers) {
                drop_for(DROP_BAD_WORKER);
                return;
            }
        }
        if (hdr.qaina.slot < meta.slot_base
                || hdr.qaina.slot - meta.slot_base >= meta.slot_count
                || (bit<32>)hdr.qaina.slot >= POOL_SLOTS) {
            drop_for(DROP_BAD_SLOT);
            return;
        }

        bit<32> slot = (bit<32>)hdr.qaina.slot;
        bit<32> copy = (bit<32>)hdr.qaina.ver * POOL_SLOTS + slot;
        bit<32> shadow = (bit<32>)(1 - hdr.qaina.ver) * POOL_SLOTS + slot;
        bit<32> base = copy * QAINA_WORDS;
        bit<32> mask = (bit<32>)1 << hdr.qaina.worker;
        bit<32> seen;
        bit<32> word;
        bit<8> count;
        bit<8> exp;
        bit<8> final;
        bit<32> seq;
        bit<16> owner;
        agg_seen.read(seen, copy);
        agg_count.read(count, copy);
        agg_owner.read(owner, copy);
        if (meta.shared != 0) {
            /* Shared allocation (ATP): the chunk (job, seq) holds this copy, or
               claims it when free; else it goes to the job's fallback host. */
            agg_final.read(final, copy);
            agg_seq.read(seq, copy);
            bool mine = owner == hdr.qaina.job_id && seq == hdr.qaina.seq && seen != 0;
            bool free = count == 0 && (seen == 0 || final == 1);
            bool retx = (hdr.qaina.flags & FLAG_RETX) != 0;
            if (from_upstream && (hdr.qaina.flags & FLAG_FLUSH) != 0) {
                /* The fallback host holds singles of the workers in payload word 0:
                   if this copy holds the chunk's other workers exactly, their partial
                   sum goes to the host and the use is given up (closed). */
                bit<32> have = hdr.payload.w0;
                bit<64> full = ((bit<64>)1 << meta.n_workers) - 1;
                if (mine && count != 0 && (seen & have) == 0
                        && (bit<64>)(seen | have) == full) {
                    ALL_WORDS(LOAD_WORD)
                    agg_exp.read(hdr.qaina.exp, copy);
                    agg_seen.write(copy, 0);
                    agg_count.write(copy, 0);
                    slots_closed.count((bit<32>)meta.job_index);
                    hdr.qaina.flags = 0;
                    partial_to_upstream();
                    hdr.qaina.worker = FALLBACK_PARTIAL;
                } else {
                    drop_for(DROP_STALE_RESULT);
                }
            } else if (from_upstream) {
                /* The fallback host's result: it releases the copy that holds the
                   chunk's sum; for a chunk no copy holds, it only goes down. */
                if (mine && count == 0 && final == 0) {
                    ALL_WORDS(STORE_WORD)
                    agg_exp.write(copy, hdr.qaina.exp);
                    agg_final.write(copy, 1);
                }
                result_to_all();
            } else if (mine && (seen & mask) == 0) {
                /* Another worker of the use that holds the copy. */
                agg_seen.write(copy, seen | mask);
                agg_packets.count((bit<32>)meta.job_index);
                ALL_WORDS(ADD_WORD)
                agg_exp.read(exp, copy);
                if ((int<8>)exp > (int<8>)hdr.qaina.exp) {
                    hdr.qaina.exp = exp;
                } else {
                    agg_exp.write(copy, hdr.qaina.exp);
                }
                count = count + 1;
                if (count == meta.n_workers) {
                    count = 0;
                }
                agg_count.write(copy, count);
                if (count == 0) {
                    /* Complete: the sum goes to the fallback host; the copy is held
                       until its result comes back. */
                    slots_closed.count((bit<32>)meta.job_index);
                    hdr.qaina.flags = 0;
                    partial_to_upstream();
                } else {
                    mark_to_drop(standard_metadata);
                }
            } else if (mine && count != 0) {
                if (retx) {
                    /* A worker of the open use timed out: the use is given up (it
                       leaves the switch: closed) and its contributions go to the
                       fallback host from now on. */
                    agg_seen.write(copy, 0);
                    agg_count.write(copy, 0);
                    slots_closed.count((bit<32>)meta.job_index);
                    hdr.qaina.flags = FLAG_RETX;
                    single_to_fallback();
                } else {
                    drop_for(DROP_DUPLICATE);
                }
            } else if (mine) {
                /* The use is complete: answer from the copy once the result is in,
                   else send the sum up again (it or the result was lost). */
                ALL_WORDS(LOAD_WORD)
                agg_exp.read(hdr.qaina.exp, copy);
                if (final == 0) {
                    hdr.qaina.flags = FLAG_RETX;
                    partial_to_upstream();
                } else {
                    retx_answered.count((bit<32>)meta.job_index);
                    result_to_sender();
                }
            } else if (free && !retx) {
                /* A free copy: this chunk claims it. */
                agg_owner.write(copy, hdr.qaina.job_id);
                agg_seq.write(copy, hdr.qaina.seq);
                agg_seen.write(copy, mask);
                ALL_WORDS(STORE_WORD)
                agg_exp.write(copy, hdr.qaina.exp);
                agg_final.write(copy, 0);
                slots_opened.count((bit<32>)meta.job_index);
                agg_packets.count((bit<32>)meta.job_index);
                if (meta.n_workers == 1) {
                    agg_count.write(copy, 0);
                    slots_closed.count((bit<32>)meta.job_index);
                    hdr.qaina.flags = 0;
                    partial_to_upstream();
                } else {
                    agg_count.write(copy, 1);
                    mark_to_drop(standard_metadata);
                }
            } else {
                /* Collision: the copy is another use's. */
                fallback_packets.count((bit<32>)meta.job_index);
                single_to_fallback();
            }
            return;
        }
        if (owner != hdr.qaina.job_id) {
            /* Another job used this copy last (the control plane has since given its
               slots to this job): whatever that job left is not this job's. */
            seen = 0;
            count = 0;
            agg_owner.write(copy, hdr.qaina.job_id);
        }

        if (from_upstream) {
            /* The upper aggregator's result for the use whose sum went up: kept, to
               answer the workers' retransmissions, and sent to every worker below. */
            agg_final.read(final, copy);
            agg_seq.read(seq, copy);
            if (seen != 0 && count == 0 && final == 0 && seq == hdr.qaina.seq) {
                ALL_WORDS(STORE_WORD)
                agg_exp.write(copy, hdr.qaina.exp);
                agg_final.write(copy, 1);
                result_to_all();
            } else {
                drop_for(DROP_STALE_RESULT);
            }
            return;
        }
        if ((seen & mask) == 0) {
            /* First contribution of this worker to this use of the slot. */
            agg_seen.write(copy, seen | mask);
            agg_seen.read(seen, shadow);
            agg_seen.write(shadow, seen & ~mask);
            agg_packets.count((bit<32>)meta.job_index);
            if (count == 0) {
                ALL_WORDS(STORE_WORD)
                agg_exp.write(copy, hdr.qaina.exp);
                agg_final.write(copy, 0);
                agg_seq.write(copy, hdr.qaina.seq);
                slots_opened.count((bit<32>)meta.job_index);
            } else {
                ALL_WORDS(ADD_WORD)
                agg_exp.read(exp, copy);
                if ((int<8>)exp > (int<8>)hdr.qaina.exp) {
                    hdr.qaina.exp = exp;
                } else {
                    agg_exp.write(copy, hdr.qaina.exp);
                }
            }
            count = count + 1;
            if (count == meta.n_workers) {
                count = 0;
            }
            agg_count.write(copy, count);
            if (count == 0) {
                slots_closed.count((bit<32>)meta.job_index);
                if (meta.up_port != 0) {
                    hdr.qaina.flags = 0;
                    partial_to_upstream();
                } else {
                    result_to_all();
                }
            } else {
                mark_to_drop(standard_metadata);
            }
        } else if (count == 0) {
            /* A retransmission after the result went out: answer from the copy; or,
               below an upper aggregator that has not answered yet, send the sum up
               again (a partial or a result was lost above). */
            ALL_WORDS(LOAD_WORD)
            agg_exp.read(hdr.qaina.exp, copy);
            agg_final.read(final, copy);
            if (meta.up_port != 0 && final == 0) {
                hdr.qaina.flags = FLAG_RETX;
                partial_to_upstream();
            } else {
                retx_answered.count((bit<32>)meta.job_index);
                result_to_sender();
            }
        } else {
            drop_for(DROP_DUPLICATE);
        }
    }
}

/* ---------------------------------------------------------------- egress */
control MyEgress(inout headers_t hdr, inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {

    @id(6) counter(MAX_JOBS, CounterType.packets_and_bytes) results_sent;

    /* Each multicast copy of a result is addressed to its receiver. */
    @id(6) action to_worker(mac_t mac, ip4_t ip, bit<8> worker) {
        hdr.ethernet.dstAddr = mac;
        hdr.ipv4.dstAddr = ip;
        hdr.qaina.worker = worker;
    }

    @id(5) table result_rewrite {
        key = { standard_metadata.egress_rid: exact; }
        actions = { to_worker; NoAction; }
        default_action = NoAction();
        size = 512;
    }

    apply {
        if (meta.is_result == 1) {
            if (standard_metadata.egress_rid != 0) {
                result_rewrite.apply();
            }
            results_sent.count((bit<32>)meta.job_index);
        }
    }
}

control MyComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(
            hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset,
              hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum,
            HashAlgorithm.csum16);
    }
}

control MyDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.qaina);
        packet.emit(hdr.payload);
    }
}

V1Switch(MyParser(), MyVerifyChecksum(), MyIngress(), MyEgress(),
         MyComputeChecksum(), MyDeparser()) main;
