"""The switch's ports: AF_PACKET sockets on the interfaces.

A port receives through a TPACKET_V2 receive ring (PACKET_MMAP) and reads frames in
place from it; it sends through a transmit ring on a second socket of the interface,
queueing frames there and handing them to the kernel with one ``send()`` per burst.
Where a ring cannot be set up, the port receives with ``recv_into`` and sends with
``send`` on its socket instead (a log line says so); ``QAINA_SWITCH_RINGS=0`` in the
environment selects that path for every port.

``loop.py`` holds the receive loop over all ports of a switch and its overload rule.
"""

from __future__ import annotations

import errno
import logging
import mmap
import socket
import struct

import numpy as np

from .pipeline import SLOT_ALIGN_OFFSET, frame_slot

log = logging.getLogger("qaina.switch.ports")

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23  # linux/if_packet.h, Linux >= 4.20
SOCKET_BUFFER = 4 << 20
BURST = 64  # frames read from one port before looking at the others
BURST_SHEDDING = 256  # ... while the switch sheds (fewer rounds for the same frames)
ROWS = max(BURST, BURST_SHEDDING)  # frame buffers of a port: one per frame of a read

# linux/if_packet.h: PACKET_MMAP with TPACKET_V2.
PACKET_RX_RING = 5
PACKET_AUXDATA = 8
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_TX_RING = 13
PACKET_LOSS = 14
PACKET_VNET_HDR = 15
TPACKET_V2 = 1
TP_STATUS_KERNEL = 0  # rx: the slot belongs to the kernel
TP_STATUS_USER = 1  # rx: the slot holds a frame for us
TP_STATUS_VLAN_VALID = 0x10  # rx: the kernel took a VLAN tag off the frame
TP_STATUS_VLAN_TPID_VALID = 0x40  # rx: ... and says which TPID it had
ETH_P_8021Q = 0x8100
TP_STATUS_AVAILABLE = 0  # tx: the slot is free
TP_STATUS_SEND_REQUEST = 1  # tx: the slot holds a frame to send
TP_STATUS_SENDING = 2  # tx: the kernel is sending the slot's frame
TP_STATUS_IN_USE = TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING  # tx: else the slot is free
TPACKET_ALIGNMENT = 16
TPACKET2_HDR_LEN = 32  # sizeof(struct tpacket2_hdr)
SOCKADDR_LL_LEN = 20  # sizeof(struct sockaddr_ll)
VNET_HDR_LEN = 10  # sizeof(struct virtio_net_hdr)
ETH_HLEN = 14

RING_FRAME_SIZE = 2048  # bytes per ring slot: header, padding and one frame
RING_BLOCK_SIZE = 1 << 16
RX_RING_FRAMES = 2048
TX_RING_FRAMES = 512
FRAME_MAX = 2048  # bytes of a frame buffer (a frame of FRAME_LONGEST and a VLAN tag put back)
ROW_SIZE = (SLOT_ALIGN_OFFSET + FRAME_MAX + 3) & ~3  # one frame buffer of the socket path

_TPACKET_REQ = struct.Struct("IIII")  # block size, block count, frame size, frame count
_TPACKET_STATS = struct.Struct("II")  # packets, drops (since the last read)
# struct tpacket_auxdata: status, len, snaplen, mac, net, vlan_tci, vlan_tpid
_AUXDATA = struct.Struct("IIIHHHH")
_AUX_SPACE = socket.CMSG_SPACE(_AUXDATA.size)
_VLAN_TAG = struct.Struct("!HH")  # TPID, TCI as they sit in a tagged frame


def restore_vlan_tag(view, length: int, status: int, tci: int, tpid: int) -> int:
    """Put back the VLAN tag the kernel took off a received frame (``length`` bytes
    at the start of ``view``, which has room for 4 more), as libpcap does for BMv2;
    returns the new length. The pipeline then sees what the wire carried."""
    if not status & TP_STATUS_VLAN_TPID_VALID:
        tpid = ETH_P_8021Q
    length = min(length, len(view) - 4)
    view[16:length + 4] = bytes(view[12:length])
    _VLAN_TAG.pack_into(view, 12, tpid, tci)
    return length + 4


def _tpacket_align(n: int) -> int:
    return (n + TPACKET_ALIGNMENT - 1) & ~(TPACKET_ALIGNMENT - 1)


#: Where an Ethernet frame starts in a TPACKET_V2 rx slot (net/packet/af_packet.c,
#: tpacket_rcv: the network header goes to TPACKET_ALIGN(tp_hdrlen + 16)).
RX_FRAME_OFFSET = _tpacket_align(_tpacket_align(TPACKET2_HDR_LEN) + SOCKADDR_LL_LEN + 16) - ETH_HLEN
#: Where the data of a frame to send starts in a TPACKET_V2 tx slot.
TX_DATA_OFFSET = _tpacket_align(TPACKET2_HDR_LEN)
#: The longest frame a port takes (what a receive ring slot holds; the socket path
#: reads no more): a longer one is dropped and counted (``rx_oversize``).
FRAME_LONGEST = RING_FRAME_SIZE - RX_FRAME_OFFSET
RX_CAPTURE_MIN = FRAME_LONGEST - 64  # a frame the kernel cut to its slot is this long or more


class PortError(OSError):
    """An interface the switch was told to use cannot be opened."""


def _packet_ring(sock, option: int, frames: int) -> int:
    """Ask for a ring of ``frames`` slots on ``sock``; returns its size in bytes."""
    per_block = RING_BLOCK_SIZE // RING_FRAME_SIZE
    blocks = (frames + per_block - 1) // per_block
    sock.setsockopt(SOL_PACKET, option, _TPACKET_REQ.pack(
        RING_BLOCK_SIZE, blocks, RING_FRAME_SIZE, blocks * per_block))
    return blocks * RING_BLOCK_SIZE


def _force_buffer(sock, option: int, force: int):
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)


class Port:
    """A switch port bound to one network interface.

    ``receive()`` returns the frames that are ready as ``(slots, lengths, frames)``
    for ``Pipeline.process_burst``; they stay valid until ``release()``. ``send()``
    queues a frame, ``send_block()`` a block of them; ``flush()`` hands the queued
    frames to the kernel.
    """

    def __init__(self, number: int, ifname: str, rings: bool = True, receive: bool = True):
        """``receive`` False: a port that only sends (it takes no frames in)."""
        self.number = number
        self.ifname = ifname
        protocol = ETH_P_ALL if receive else 0
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(protocol))
        except PermissionError:
            raise PortError(f"port {number}: opening a raw socket needs root "
                            "(run the switch as root)") from None
        try:
            sock.bind((ifname, protocol))
        except OSError as exc:
            sock.close()
            raise PortError(f"port {number}: interface {ifname!r}: {exc.strerror}") from None
        # The switch must not see its own transmissions, whichever socket sends them.
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)  # VLAN tags the kernel takes off
        _force_buffer(sock, socket.SO_RCVBUF, 33)  # SO_RCVBUFFORCE
        _force_buffer(sock, socket.SO_SNDBUF, 32)  # SO_SNDBUFFORCE
        sock.setblocking(False)
        self.sock = sock
        self.rx_packets = 0
        self.rx_reads = 0  # reads that returned frames (rx / rx_reads: frames per read)
        self.rx_dropped = 0  # dropped by the kernel: the ring or socket queue was full
        self.shed = 0  # frames of whole slot uses the overloaded switch shed
        self.rx_oversize = 0  # frames longer than a port takes (FRAME_LONGEST), dropped
        self.tx_packets = 0
        self.tx_calls = 0  # transmit system calls (tx / tx_calls: frames per call)
        self.tx_errors = 0
        self.link_errors = 0  # errors the socket reported (link down, interface gone)
        self.tx_queued = 0  # frames in the tx ring not yet handed to the kernel
        # Frame buffers of the socket path; in ring mode, for frames placed unusually.
        self._rows = bytearray(ROWS * ROW_SIZE)
        self._row_slots = [frame_slot(self._rows, i * ROW_SIZE + SLOT_ALIGN_OFFSET, FRAME_MAX)
                           for i in range(ROWS)]
        self._row_frames = np.ndarray((ROWS, FRAME_MAX), np.uint8, buffer=self._rows,
                                      offset=SLOT_ALIGN_OFFSET, strides=(ROW_SIZE, 1))
        self._rx_map = self._tx_map = self._tx_sock = None
        self._rx_words = self._tx_words = self._tx_halves = None
        self._rx_slots = self._tx_data = ()
        self._held = 0  # rx ring slots handed out by receive() and not yet released
        if rings and receive:
            try:
                self._map_rx_ring()
            except OSError as exc:
                log.warning("port %d (%s): no PACKET_MMAP receive ring (%s); using recv",
                            number, ifname, exc.strerror or exc)
                self._unmap_rx()
        if rings:
            try:
                self._map_tx_ring()
            except OSError as exc:
                log.warning("port %d (%s): no PACKET_MMAP transmit ring (%s); using send",
                            number, ifname, exc.strerror or exc)
                self._unmap_tx()
        if self._rx_map is None:
            self.receive = self._receive_socket
            self.release = self._release_nothing
            self.backlog = self._backlog_unknown
        if self._tx_map is None:
            self.send = self._send_socket
            self.send_block = self._send_each
            self.flush = self._flush_nothing
        #: how the port receives and sends: "ring" (PACKET_MMAP) or "socket"
        self.rx_mode = "socket" if self._rx_map is None else "ring"
        self.tx_mode = "socket" if self._tx_map is None else "ring"

    # -- receive ring -------------------------------------------------------------------
    def _map_rx_ring(self):
        sock = self.sock
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        size = _packet_ring(sock, PACKET_RX_RING, RX_RING_FRAMES)
        self._rx_map = mmap.mmap(sock.fileno(), size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        # Slot headers as 32-bit words: tp_status, tp_len, tp_snaplen, tp_mac | tp_net << 16.
        self._rx_words = memoryview(self._rx_map).cast("I")
        count = self._rx_count = size // RING_FRAME_SIZE
        self._rx_head = 0
        self._rx_status = [i * RING_FRAME_SIZE // 4 for i in range(count)]
        self._rx_slots = [frame_slot(self._rx_map, i * RING_FRAME_SIZE + RX_FRAME_OFFSET,
                                     RING_FRAME_SIZE - RX_FRAME_OFFSET) for i in range(count)]
        # The same frames as the rows of one array, and the slot headers' fields as
        # columns: tp_status, tp_snaplen and tp_mac.
        self._rx_frames = np.ndarray((count, RING_FRAME_SIZE - RX_FRAME_OFFSET), np.uint8,
                                     buffer=self._rx_map, offset=RX_FRAME_OFFSET,
                                     strides=(RING_FRAME_SIZE, 1))
        column = {"buffer": self._rx_map, "strides": (RING_FRAME_SIZE,)}
        self._rx_status_col = np.ndarray((count,), np.uint32, offset=0, **column)
        self._rx_len_col = np.ndarray((count,), np.uint32, offset=4, **column)
        self._rx_snaplen_col = np.ndarray((count,), np.uint32, offset=8, **column)
        self._rx_mac_col = np.ndarray((count,), np.uint16, offset=12, **column)

    def receive(self, most: int = BURST):
        """Frames ready in the receive ring: ``(slots, lengths, frames)``.

        At most ``most`` frames, and none past the end of the ring; ``frames`` is the
        same frames as the rows of one array (None if one had to be copied elsewhere).
        """
        head = self._rx_head
        limit = min(most, self._rx_count - head)
        # The kernel fills slots in ring order and we release them in ring order, so
        # the ready frames are the slots from head on up to the first one it still owns.
        status = self._rx_status_col[head:head + limit]
        ready = (status & TP_STATUS_USER) != 0
        n = limit if ready[-1] else int(np.argmin(ready))
        slots = self._rx_slots[head:head + n]
        lengths = self._rx_snaplen_col[head:head + n].tolist()
        frames = self._rx_frames[head:head + n]
        if n and ((self._rx_mac_col[head:head + n] != RX_FRAME_OFFSET).any()
                  or (status[:n] & TP_STATUS_VLAN_VALID).any()):
            self._copy_unusual(self._rx_status[head:head + n], slots, lengths)
            frames = None
        if n and max(lengths) >= RX_CAPTURE_MIN:  # some may have been cut to their slot
            cut = np.flatnonzero(self._rx_len_col[head:head + n]
                                 > self._rx_snaplen_col[head:head + n])
            if len(cut):
                slots, lengths = self._drop_oversize(cut.tolist(), slots, lengths,
                                                     self._rx_len_col[head + cut[0]])
                frames = None
        self._held = n
        self.rx_packets += n
        self.rx_reads += n > 0
        return slots, lengths, frames

    def _copy_unusual(self, ready, slots, lengths):
        """Frames not where they normally start in their slot, and frames whose VLAN
        tag the kernel took off (put back here), go to frame buffers."""
        words = self._rx_words
        for k, i in enumerate(ready):
            start = i * 4 + (words[i + 3] & 0xFFFF)
            status = words[i]
            if start != i * 4 + RX_FRAME_OFFSET or status & TP_STATUS_VLAN_VALID:
                lengths[k] = n = min(lengths[k], FRAME_MAX)
                slots[k] = self._row_slots[k]
                slots[k][0][:n] = self._rx_map[start:start + n]
                if status & TP_STATUS_VLAN_VALID:
                    tag = words[i + 6]  # tp_vlan_tci | tp_vlan_tpid << 16
                    lengths[k] = restore_vlan_tag(slots[k][0], n, status, tag & 0xFFFF,
                                                  tag >> 16)

    def _drop_oversize(self, cut: list[int], slots, lengths, longest: int):
        """Frames ``cut`` (indexes) of a read were longer than a ring slot holds: the
        slots and lengths of the others."""
        self._count_oversize(len(cut), longest)
        drop = set(cut)
        keep = [k for k in range(len(lengths)) if k not in drop]
        return [slots[k] for k in keep], [lengths[k] for k in keep]

    def _count_oversize(self, count: int, longest: int):
        """``count`` frames longer than a port takes were dropped (never forwarded cut
        short): counted, and said once."""
        self.rx_oversize += count
        if self.rx_oversize == count:
            log.warning("port %d (%s): a frame of %d bytes is longer than the %d a port "
                        "takes: dropped, as every such frame (counted as rx_oversize in "
                        "the port stats); keep the interface's MTU at %d or less",
                        self.number, self.ifname, longest, FRAME_LONGEST,
                        FRAME_LONGEST - ETH_HLEN)

    def backlog(self) -> int:
        """How many frames the receive ring holds, those of the last ``receive()``
        included (the kernel fills slots in ring order, so they are the slots from
        the head on up to the first one it owns: a binary search of the slot
        headers)."""
        status, count, head = self._rx_status_col, self._rx_count, self._rx_head
        low, high = 0, count  # slots low.. may hold frames, high.. do not
        while low < high:
            middle = (low + high) // 2
            if status[(head + middle) % count] & TP_STATUS_USER:
                low = middle + 1
            else:
                high = middle
        return low

    def release(self):
        """Give the frames of the last ``receive()`` back to the kernel."""
        head = self._rx_head
        self._rx_status_col[head:head + self._held] = TP_STATUS_KERNEL
        head += self._held
        self._rx_head = head if head < self._rx_count else 0
        self._held = 0

    def _unmap_rx(self):
        self._rx_slots = ()
        self._rx_frames = self._rx_status_col = self._rx_snaplen_col = self._rx_mac_col = None
        self._rx_len_col = None
        self._rx_words = self._release_view(self._rx_words)
        self._rx_map = self._close_map(self._rx_map)

    # -- transmit ring ------------------------------------------------------------------
    def _map_tx_ring(self):
        """A transmit ring on a socket of its own that receives nothing (protocol 0).

        With a virtio-net header in front of each frame (PACKET_VNET_HDR) whose
        ``hdr_len`` covers the whole frame, the kernel copies the frame into the
        packet it sends instead of attaching ring pages that a veth would have to
        copy again.
        """
        tx = self._tx_sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        tx.bind((self.ifname, 0))
        tx.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        tx.setsockopt(SOL_PACKET, PACKET_LOSS, 1)  # a refused frame is skipped, not stuck
        try:
            tx.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            self._vnet = VNET_HDR_LEN
        except OSError:
            self._vnet = 0
        _force_buffer(tx, socket.SO_SNDBUF, 32)
        size = _packet_ring(tx, PACKET_TX_RING, TX_RING_FRAMES)
        self._tx_map = mmap.mmap(tx.fileno(), size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        self._tx_words = memoryview(self._tx_map).cast("I")
        self._tx_halves = memoryview(self._tx_map).cast("H")  # for virtio_net_hdr.hdr_len
        self._tx_count = size // RING_FRAME_SIZE
        self._tx_head = 0
        self._tx_status = [i * RING_FRAME_SIZE // 4 for i in range(self._tx_count)]
        data = TX_DATA_OFFSET + self._vnet
        view = memoryview(self._tx_map)
        self._tx_data = [view[i * RING_FRAME_SIZE + data:(i + 1) * RING_FRAME_SIZE]
                         for i in range(self._tx_count)]
        view.release()
        self._tx_max = RING_FRAME_SIZE - data
        # virtio_net_hdr.hdr_len of slot i, as an index of _tx_halves
        self._hdr_len_at = (TX_DATA_OFFSET + 2) // 2
        # The same ring as numpy columns, for send_block: slot status, tp_len,
        # virtio_net_hdr.hdr_len and the frame bytes.
        column = {"buffer": self._tx_map, "strides": (RING_FRAME_SIZE,)}
        self._tx_status_col = np.ndarray((self._tx_count,), np.uint32, offset=0, **column)
        self._tx_len_col = np.ndarray((self._tx_count,), np.uint32, offset=4, **column)
        self._tx_hdr_len_col = np.ndarray((self._tx_count,), np.uint16,
                                          offset=TX_DATA_OFFSET + 2, **column)
        self._tx_frames = np.ndarray((self._tx_count, self._tx_max), np.uint8, buffer=self._tx_map,
                                     offset=data, strides=(RING_FRAME_SIZE, 1))

    def send(self, frame):
        """Queue ``frame`` in the transmit ring (sent by the next ``flush()``)."""
        head = self._tx_head
        i = self._tx_status[head]
        words = self._tx_words
        if words[i] & TP_STATUS_IN_USE:
            self.flush()  # the ring is full: let the kernel catch up
            if words[i] & TP_STATUS_IN_USE:
                self.tx_errors += 1
                return
        n = len(frame)
        if n > self._tx_max:
            self.tx_errors += 1
            return
        self._tx_data[head][:n] = frame
        if self._vnet:
            self._tx_halves[2 * i + self._hdr_len_at] = n
        words[i + 1] = n + self._vnet
        words[i] = TP_STATUS_SEND_REQUEST
        self._tx_head = head + 1 if head + 1 < self._tx_count else 0
        self.tx_queued += 1

    def send_block(self, frames: np.ndarray):
        """Queue every row of ``frames`` (one frame each, all of one length) at once."""
        count, n = frames.shape
        head = self._tx_head
        if count > self._tx_count or n > self._tx_max:
            return self._send_each(frames)
        end = head + count
        spans = ((head, end, 0),) if end <= self._tx_count else (
            (head, self._tx_count, 0), (0, end - self._tx_count, self._tx_count - head))
        status = self._tx_status_col
        for retry in (False, True):
            if not any((status[a:b] & TP_STATUS_IN_USE).any() for a, b, _ in spans):
                break
            if retry:  # the ring is full: what fits goes one by one, the rest is dropped
                return self._send_each(frames)
            self.flush()
        for a, b, first in spans:
            self._tx_frames[a:b, :n] = frames[first:first + b - a]
            if self._vnet:
                self._tx_hdr_len_col[a:b] = n
            self._tx_len_col[a:b] = n + self._vnet
            status[a:b] = TP_STATUS_SEND_REQUEST
        self._tx_head = end if end < self._tx_count else end - self._tx_count
        self.tx_queued += count

    def flush(self) -> bool:
        """Hand the queued frames to the kernel; False if some have to wait."""
        if not self.tx_queued:
            return True
        self.tx_calls += 1
        try:
            self._tx_sock.send(b"", socket.MSG_DONTWAIT)
        except OSError as exc:  # EAGAIN / ENOBUFS: the socket's send buffer is full
            if exc.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN, errno.ENXIO):
                raise
        # The kernel takes queued frames in order; the ones it left are still requests.
        words, status, count = self._tx_words, self._tx_status, self._tx_count
        head = self._tx_head
        waiting = 0
        while waiting < self.tx_queued:
            head = head - 1 if head else count - 1
            if words[status[head]] != TP_STATUS_SEND_REQUEST:
                break
            waiting += 1
        self.tx_packets += self.tx_queued - waiting
        self.tx_queued = waiting
        return not waiting

    def _unmap_tx(self):
        self._tx_data = ()
        self._tx_status_col = self._tx_len_col = self._tx_hdr_len_col = self._tx_frames = None
        self._tx_words = self._release_view(self._tx_words)
        self._tx_halves = self._release_view(self._tx_halves)
        self._tx_map = self._close_map(self._tx_map)
        if self._tx_sock is not None:
            self._tx_sock.close()
            self._tx_sock = None

    # -- socket path --------------------------------------------------------------------
    def _receive_socket(self, most: int = BURST):
        recvmsg_into = self.sock.recvmsg_into
        slots, lengths = self._row_slots[:most], []
        read = 0
        while len(lengths) < len(slots):
            slot = slots[len(lengths)]
            try:
                n, ancillary, flags, _ = recvmsg_into((slot[0][:FRAME_LONGEST],), _AUX_SPACE,
                                                      socket.MSG_TRUNC)
                read += 1
                if flags & socket.MSG_TRUNC:  # n: the frame's whole length
                    self._count_oversize(1, n)
                    continue
                for level, kind, data in ancillary:
                    if level == SOL_PACKET and kind == PACKET_AUXDATA:
                        status, _, _, _, _, tci, tpid = _AUXDATA.unpack_from(data)
                        if status & TP_STATUS_VLAN_VALID:
                            n = restore_vlan_tag(slot[0], n, status, tci, tpid)
                lengths.append(n)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno == errno.ENETDOWN:
                    break
                raise
        self.rx_packets += read
        self.rx_reads += bool(read)
        return slots[:len(lengths)], lengths, self._row_frames[:len(lengths)]

    def _release_nothing(self):
        pass

    @staticmethod
    def _backlog_unknown() -> int:
        return 0  # the socket path does not say how much waits: it never sheds

    def _send_socket(self, frame):
        self.tx_calls += 1
        try:
            self.sock.send(frame)
            self.tx_packets += 1
        except OSError as exc:  # ENOBUFS / EAGAIN: the interface queue is full
            self.tx_errors += 1
            if exc.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN, errno.ENXIO):
                raise

    def _send_each(self, frames: np.ndarray):
        """``send_block`` one frame at a time."""
        for frame in frames:
            self.send(memoryview(frame))

    def _flush_nothing(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------
    @staticmethod
    def _release_view(view):
        if view is not None:
            view.release()

    @staticmethod
    def _close_map(ring):
        if ring is not None:
            try:
                ring.close()
            except BufferError:  # a view of it is still alive somewhere; unmapped at exit
                pass

    def clear_error(self) -> int:
        """Read, and so clear, the socket's pending error (ENETDOWN when the link went
        down or the interface went away; a read from the socket returns it, but frames
        come from the ring): epoll reports the socket ready until then. Returns it."""
        try:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        except OSError:
            return 0
        if err:
            self.link_errors += 1
            if self.link_errors <= 10:
                log.warning("port %d (%s): %s", self.number, self.ifname, errno.errorcode.get(
                    err, err))
        return err

    def kernel_drops(self) -> int:
        """Frames the kernel dropped for this port so far (full ring or queue)."""
        if self.sock.fileno() < 0:  # closed: the count as of closing
            return self.rx_dropped
        try:
            raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size)
        except OSError:
            return self.rx_dropped
        self.rx_dropped += _TPACKET_STATS.unpack(raw)[1]
        return self.rx_dropped

    def close(self):
        if self.sock.fileno() >= 0:
            self.kernel_drops()  # the socket's statistics end with it
        self._unmap_rx()
        self._unmap_tx()
        self.sock.close()
