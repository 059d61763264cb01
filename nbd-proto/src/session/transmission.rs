//! The transmission phase: request headers, payloads, and each command's checks and ops.

use super::*;

impl ServerSession {
    pub(super) fn transmission(&mut self) -> Result<bool, SessionError> {
        if let Some(p) = self.payload.take() {
            return self.receive_payload(p);
        }
        if self.stopping {
            self.phase = Phase::Draining;
            return Ok(false);
        }
        if self.ops.len() >= self.config.max_in_flight
            || self.buffered >= self.config.max_buffered
            || !self.streaming.is_empty()
        {
            return Ok(false);
        }
        let (flags, command, cookie, offset, length) = if self.extended {
            if self.input.len() < ExtendedRequest::LEN {
                return Ok(false);
            }
            let r = ExtendedRequest::parse(&self.input[..ExtendedRequest::LEN])
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            self.input.advance(ExtendedRequest::LEN);
            // The extension asks writes to set PAYLOAD_LEN; qemu 10's client does not, and
            // a write always carries its data: take it as set.
            let flags = if r.command == Command::Write {
                r.flags | proto::CMD_FLAG_PAYLOAD_LEN
            } else {
                r.flags
            };
            (flags, r.command, r.handle, r.offset, r.length)
        } else {
            if self.input.len() < Request::LEN {
                return Ok(false);
            }
            let r = Request::parse(&self.input[..Request::LEN])
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            self.input.advance(Request::LEN);
            let mut flags = r.flags;
            if r.command == Command::Write {
                // A compact write always carries its payload.
                flags |= proto::CMD_FLAG_PAYLOAD_LEN;
            } else if flags & proto::CMD_FLAG_PAYLOAD_LEN != 0 {
                // Not a flag in compact requests: refused below, and no payload follows.
                flags = (flags & !proto::CMD_FLAG_PAYLOAD_LEN) | 0x8000;
            }
            (flags, r.command, r.handle, r.offset, u64::from(r.length))
        };
        if command == Command::Disc {
            self.phase = Phase::Draining;
            return Ok(false);
        }
        self.stats.requests += 1;
        if let Some((min, _)) = self.hand_off {
            let long = if command == Command::Write && length >= min {
                length.min(STEER_CAP)
            } else {
                0
            };
            self.landable = self.landable - self.landable / STEER_WEIGHT + long / STEER_WEIGHT;
        }
        self.request(flags, command, cookie, offset, length)?;
        Ok(true)
    }

    pub(super) fn receive_payload(&mut self, p: Payload) -> Result<bool, SessionError> {
        match p {
            Payload::SkipOption { .. } => Err(SessionError::Protocol(
                "option data in transmission".to_owned(),
            )),
            Payload::Skip {
                mut left,
                cookie,
                offset,
                error,
            } => {
                let n = left.min(self.input.len() as u64);
                self.input.advance(n as usize);
                left -= n;
                if left > 0 {
                    self.payload = Some(Payload::Skip {
                        left,
                        cookie,
                        offset,
                        error,
                    });
                    return Ok(false);
                }
                self.refuse(
                    cookie,
                    offset,
                    error,
                    "request refused (its payload was read and dropped)",
                );
                Ok(true)
            }
            Payload::HandedOff { req, at, left } => {
                // The caller is taking the bytes from the stream.
                self.payload = Some(Payload::HandedOff { req, at, left });
                Ok(false)
            }
            Payload::Write { req, at, left } => {
                let step = u64::from(self.config.max_request);
                let piece = step.min(left);
                let have = self.input.len() as u64;
                if let Some((min, max)) = self.hand_off {
                    if piece <= max && piece - have.min(piece) >= min {
                        return self.hand_off_piece(req, at, left, piece);
                    }
                }
                if have < piece {
                    self.make_room_aligned(piece as usize);
                    self.payload = Some(Payload::Write { req, at, left });
                    return Ok(false);
                }
                let data = self.input.split_to(piece as usize).freeze();
                let op = self.write_piece(req, at, piece, data)?;
                self.ready.push_back(op);
                if left > piece {
                    self.payload = Some(Payload::Write {
                        req,
                        at: at + piece,
                        left: left - piece,
                    });
                }
                Ok(true)
            }
        }
    }

    /// Lets out the next `piece` bytes of write `req` (`left` to come, from `at`) as an op
    /// of what the input buffer holds (less than the piece) and the rest on the stream,
    /// for the caller to take (see [`ServerSession::hand_off_payloads`]).
    fn hand_off_piece(
        &mut self,
        req: u64,
        at: u64,
        left: u64,
        piece: u64,
    ) -> Result<bool, SessionError> {
        let head = self.input.split().freeze();
        // The usual room for the next reads (the old buffer goes with the head).
        self.input.reserve(INPUT_ROOM);
        let on_stream = piece - head.len() as u64;
        let mut op = self.write_piece(req, at, piece, head)?;
        op.on_stream = on_stream;
        self.ready.push_back(op);
        self.payload = Some(Payload::HandedOff {
            req,
            at: at + piece,
            left: left - piece,
        });
        Ok(false)
    }

    /// The op that writes the `piece` bytes of write `req` at `at` (`data`, all of them or
    /// those already received), counted against the request and the byte budget.
    fn write_piece(
        &mut self,
        req: u64,
        at: u64,
        piece: u64,
        data: Bytes,
    ) -> Result<Op, SessionError> {
        let Some(r) = self.requests.get_mut(&req) else {
            return Err(SessionError::Protocol(
                "write payload without a request".to_owned(),
            ));
        };
        r.to_receive -= piece;
        r.open += 1;
        r.next = at + piece;
        let flags = r.flags;
        self.buffered += piece;
        Ok(self.new_op(req, at, OpKind::Write(data), at, piece, flags))
    }

    /// Makes room in the input buffer for a payload piece of `piece` bytes of which some
    /// have arrived, in a buffer that starts the payload on a [`PAYLOAD_ALIGN`] boundary: a
    /// device opened `O_DIRECT` then writes the piece as it is (no aligned copy of all of
    /// it per write). The bytes already here are copied once (growing a buffer copies them
    /// too).
    ///
    /// Only for pieces of [`ALIGN_FROM`] bytes or more: a small one is left where it is (a
    /// new buffer for each would also shrink the room the next reads have: 4 KiB random
    /// writes over a Unix socket fell from 177 k/s to 106 k/s), and the new buffer keeps
    /// the usual room beyond the piece for what follows it.
    fn make_room_aligned(&mut self, piece: usize) {
        let aligned = self.input.as_ptr() as usize % PAYLOAD_ALIGN == 0;
        if piece < ALIGN_FROM || (aligned && self.input.capacity() >= piece) {
            self.input.reserve(piece.saturating_sub(self.input.len()));
            return;
        }
        let mut fresh = BytesMut::with_capacity(piece + PAYLOAD_ALIGN + INPUT_ROOM);
        let gap = (PAYLOAD_ALIGN - fresh.as_ptr() as usize % PAYLOAD_ALIGN) % PAYLOAD_ALIGN;
        fresh.resize(gap, 0);
        fresh.advance(gap);
        fresh.extend_from_slice(&self.input);
        self.input = fresh;
    }

    /// Validates one request and turns it into ops (or answers it at once): the checks
    /// every command shares, then the command's own handling.
    pub(super) fn request(
        &mut self,
        flags: u16,
        command: Command,
        cookie: u64,
        offset: u64,
        length: u64,
    ) -> Result<(), SessionError> {
        let Some(e) = self.export.clone() else {
            return Err(SessionError::Protocol(
                "request before an export was chosen".to_owned(),
            ));
        };
        let has_payload = flags & proto::CMD_FLAG_PAYLOAD_LEN != 0;
        let req = self.next_id;
        self.next_id += 1;
        let pending = Pending {
            cookie,
            command,
            flags,
            offset,
            length,
            open: 0,
            next: offset,
            held: BTreeMap::new(),
            answered: false,
            failed: None,
            to_receive: 0,
        };
        if let Err((error, msg)) = self.check_request(&e, &pending) {
            self.refuse_after_payload(&pending, has_payload, error, &msg);
            return Ok(());
        }
        let ranged = !matches!(command, Command::Flush | Command::Other(_) | Command::Disc);
        let zero_len = ranged && length == 0;
        match command {
            Command::Read => self.read_request(req, pending, zero_len),
            Command::Write => self.write_request(req, pending, zero_len),
            Command::BlockStatus => self.block_status_request(&e, req, pending, zero_len),
            _ => self.plain_request(req, pending, zero_len),
        }
        Ok(())
    }

    /// The checks every command shares: its flags, a write to a read-only export, an
    /// unknown command, the range, the agreed alignment. The errno and message of the
    /// first that fails.
    pub(super) fn check_request(&self, e: &ExportEntry, p: &Pending) -> Result<(), (u32, String)> {
        let (flags, command, offset, length) = (p.flags, p.command, p.offset, p.length);
        // Flags: FUA on any command; the others only where they belong.
        let allowed = proto::CMD_FLAG_FUA
            | match command {
                Command::WriteZeroes => proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO,
                Command::Read if self.structured => proto::CMD_FLAG_DF,
                Command::BlockStatus => proto::CMD_FLAG_REQ_ONE,
                Command::Write => proto::CMD_FLAG_PAYLOAD_LEN,
                _ => 0,
            };
        if flags & !allowed != 0 {
            return Err((
                errno::EINVAL,
                format!("flags {flags:#x} are not valid on {command:?}"),
            ));
        }
        let writes = matches!(
            command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        if writes && e.read_only {
            return Err((errno::EPERM, "the export is read-only".to_owned()));
        }
        if let Command::Other(c) = command {
            return Err((errno::EINVAL, format!("unknown command {c}")));
        }
        let ranged = !matches!(command, Command::Flush | Command::Disc);
        if ranged && offset.checked_add(length).is_none_or(|end| end > e.size) {
            let error = if writes { errno::ENOSPC } else { errno::EINVAL };
            return Err((
                error,
                "the request runs past the end of the export".to_owned(),
            ));
        }
        let min = u64::from(e.limits.logical_block_size.max(512));
        if ranged && self.strict && (offset % min != 0 || length % min != 0) {
            return Err((
                errno::EINVAL,
                format!("offset and length must be multiples of the {min}-byte block agreed"),
            ));
        }
        Ok(())
    }

    /// Refuses request `p`; a payload that follows it is read and dropped first (a payload
    /// over the agreed maximum too, as nbdkit does: the spec lets a server disconnect
    /// instead, but a client that sent one too large keeps its connection).
    pub(super) fn refuse_after_payload(
        &mut self,
        p: &Pending,
        has_payload: bool,
        error: u32,
        msg: &str,
    ) {
        if has_payload && p.length > 0 {
            self.payload = Some(Payload::Skip {
                left: p.length,
                cookie: p.cookie,
                offset: p.offset,
                error,
            });
        } else {
            self.refuse(p.cookie, p.offset, error, msg);
        }
    }

    /// A read: streamed in pieces of at most the maximum request as the byte budget allows.
    pub(super) fn read_request(&mut self, req: u64, pending: Pending, zero_len: bool) {
        let (flags, cookie, offset, length) = (
            pending.flags,
            pending.cookie,
            pending.offset,
            pending.length,
        );
        let max = u64::from(self.config.max_request);
        let df = flags & proto::CMD_FLAG_DF != 0;
        if length > max && (self.strict || df) {
            let error = if df { errno::EOVERFLOW } else { errno::EINVAL };
            self.refuse(
                cookie,
                offset,
                error,
                "the read is larger than the maximum payload",
            );
            return;
        }
        if length > MAX_SPAN {
            self.refuse(
                cookie,
                offset,
                errno::EOVERFLOW,
                "reads are served up to 4 GiB",
            );
            return;
        }
        if !self.structured && length > self.config.max_buffered {
            // A simple reply's data is sent whole, so it is gathered whole first.
            self.refuse(
                cookie,
                offset,
                errno::EOVERFLOW,
                "reads larger than the connection's buffer need structured replies",
            );
            return;
        }
        if zero_len {
            self.count_reply(false);
            if self.structured {
                self.chunk(cookie, offset, proto::REPLY_FLAG_DONE, &Chunk::None, None);
            } else {
                self.ok_reply(cookie, offset);
            }
            return;
        }
        self.requests.insert(req, pending);
        self.streaming.push_back(req);
        self.release_streams();
    }

    /// A write: its payload is received in pieces, each an op as it arrives.
    pub(super) fn write_request(&mut self, req: u64, pending: Pending, zero_len: bool) {
        let (cookie, offset, length) = (pending.cookie, pending.offset, pending.length);
        let max = u64::from(self.config.max_request);
        if length > max && self.strict {
            self.refuse_after_payload(
                &pending,
                true,
                errno::EINVAL,
                "the write is larger than the maximum payload",
            );
            return;
        }
        if zero_len {
            self.count_reply(false);
            self.ok_reply(cookie, offset);
            return;
        }
        let mut p = pending;
        p.to_receive = length;
        self.requests.insert(req, p);
        self.payload = Some(Payload::Write {
            req,
            at: offset,
            left: length,
        });
    }

    /// Block status: an allocation query for `base:allocation`, the layout for
    /// `tagstripe:component`.
    pub(super) fn block_status_request(
        &mut self,
        e: &ExportEntry,
        req: u64,
        pending: Pending,
        zero_len: bool,
    ) {
        let (flags, cookie, offset, length) = (
            pending.flags,
            pending.cookie,
            pending.offset,
            pending.length,
        );
        let min = u64::from(e.limits.logical_block_size.max(512));
        let size = e.size;
        if self.contexts.is_empty() {
            self.refuse(
                cookie,
                offset,
                errno::EINVAL,
                "no metadata context was selected",
            );
            return;
        }
        if zero_len {
            self.refuse(cookie, offset, errno::EINVAL, "block status of zero bytes");
            return;
        }
        let mut p = pending;
        // A hint: at most MAX_SPAN at a time (the client asks again for the rest).
        p.length = length.min(MAX_SPAN);
        if self.contexts.contains(&Context::Allocation) {
            let (off, len) = (p.offset, p.length);
            p.open = 1;
            p.next = off + len;
            self.requests.insert(req, p);
            // Whole logical blocks around the range (the extents' first is cut to
            // the offset asked for).
            let a0 = off / min * min;
            let a1 = ((off + len).div_ceil(min) * min)
                .min(size / min * min)
                .max(a0 + min);
            let op = self.new_op(req, off, OpKind::Allocation, a0, a1 - a0, flags);
            self.ready.push_back(op);
        } else {
            self.block_status_reply(&p, None);
            self.count_reply(false);
        }
    }

    /// Flush, trim, cache and write-zeroes: one op each.
    pub(super) fn plain_request(&mut self, req: u64, pending: Pending, zero_len: bool) {
        let (flags, cookie, offset, length, command) = (
            pending.flags,
            pending.cookie,
            pending.offset,
            pending.length,
            pending.command,
        );
        if zero_len {
            self.count_reply(false);
            self.ok_reply(cookie, offset);
            return;
        }
        let kind = match command {
            Command::Flush => OpKind::Flush,
            Command::Trim => OpKind::Trim,
            Command::Cache => OpKind::Cache,
            Command::WriteZeroes => OpKind::WriteZeroes {
                unmap: flags & proto::CMD_FLAG_NO_HOLE == 0,
                fast: flags & proto::CMD_FLAG_FAST_ZERO != 0,
            },
            _ => {
                unreachable!("read, write, block status, disc and others are handled above")
            }
        };
        // A flush has no range: whatever the header carried is not passed on (nor
        // added up: unchecked, its offset and length may overflow).
        let (o, l) = if kind == OpKind::Flush {
            (0, 0)
        } else {
            (offset, length)
        };
        let mut p = pending;
        p.open = 1;
        p.length = l;
        p.next = p.offset + l;
        self.requests.insert(req, p);
        let op = self.new_op(req, offset, kind, o, l, flags);
        self.ready.push_back(op);
    }
}
