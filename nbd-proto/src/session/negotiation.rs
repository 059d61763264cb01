//! The negotiation phase: the greeting, the options (`INFO`, `GO`, `LIST`, `STARTTLS`,
//! structured replies, extended headers, metadata contexts) and what an export offers.

use super::*;

impl ServerSession {
    pub(super) fn process_inner(&mut self) -> Result<(), SessionError> {
        loop {
            let progressed = match self.phase {
                Phase::Hello => self.hello()?,
                Phase::Options => self.option()?,
                Phase::Transmission => self.transmission()?,
                Phase::StartTls | Phase::Draining | Phase::Closed => false,
            };
            if !progressed {
                return Ok(());
            }
        }
    }

    pub(super) fn hello(&mut self) -> Result<bool, SessionError> {
        if self.input.len() < 4 {
            return Ok(false);
        }
        let flags = self.input.get_u32();
        if flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
            return Err(SessionError::Protocol(format!(
                "unknown client flags {flags:#x}"
            )));
        }
        self.no_zeroes = flags & proto::FLAG_C_NO_ZEROES != 0;
        self.phase = Phase::Options;
        Ok(true)
    }

    pub(super) fn reply(&mut self, option: u32, kind: u32, data: &[u8]) {
        let b = proto::OptionReply::encode(option, kind, data);
        self.emit(&b);
    }

    pub(super) fn option(&mut self) -> Result<bool, SessionError> {
        // Option data being thrown away (too large to hold).
        if let Some(Payload::SkipOption { left, option }) = &mut self.payload {
            let n = (*left).min(self.input.len() as u64);
            self.input.advance(n as usize);
            *left -= n;
            if *left > 0 {
                return Ok(false);
            }
            let option = *option;
            self.payload = None;
            self.reply(option, proto::REP_ERR_TOO_BIG, b"option data too large");
            return Ok(true);
        }
        if self.input.len() < OptionHeader::LEN {
            return Ok(false);
        }
        let h = OptionHeader::parse(&self.input[..OptionHeader::LEN])
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        if u64::from(h.length) > MAX_OPTION {
            self.input.advance(OptionHeader::LEN);
            self.payload = Some(Payload::SkipOption {
                left: h.length.into(),
                option: h.option,
            });
            return Ok(true);
        }
        if self.input.len() < OptionHeader::LEN + h.length as usize {
            self.input.reserve(OptionHeader::LEN + h.length as usize);
            return Ok(false);
        }
        self.input.advance(OptionHeader::LEN);
        let data = self.input.split_to(h.length as usize).freeze();
        self.handle_option(h.option, &data)?;
        Ok(true)
    }

    pub(super) fn handle_option(&mut self, option: u32, data: &[u8]) -> Result<(), SessionError> {
        if self.config.tls == TlsPolicy::Require
            && !self.tls_active
            && !matches!(option, proto::OPT_STARTTLS | proto::OPT_ABORT)
        {
            if option == proto::OPT_EXPORT_NAME {
                // No error reply is possible for this option: close.
                return Err(SessionError::Protocol(
                    "NBD_OPT_EXPORT_NAME before TLS on a server that requires it".to_owned(),
                ));
            }
            self.reply(
                option,
                proto::REP_ERR_TLS_REQD,
                b"TLS is required: send NBD_OPT_STARTTLS",
            );
            return Ok(());
        }
        match option {
            proto::OPT_STARTTLS => {
                if self.config.tls == TlsPolicy::Off {
                    self.reply(
                        option,
                        proto::REP_ERR_UNSUP,
                        b"this server has no TLS configured",
                    );
                } else if self.tls_active {
                    self.reply(option, proto::REP_ERR_INVALID, b"TLS is already running");
                } else if !data.is_empty() {
                    self.reply(option, proto::REP_ERR_INVALID, b"STARTTLS takes no data");
                } else {
                    self.reply(option, proto::REP_ACK, &[]);
                    // Everything negotiated in the clear is forgotten: it starts again inside.
                    self.structured = false;
                    self.extended = false;
                    self.contexts.clear();
                    self.contexts_for = None;
                    self.phase = Phase::StartTls;
                    self.starttls = true;
                }
            }
            proto::OPT_EXPORT_NAME => {
                if self.extended {
                    return Err(SessionError::Protocol(
                        "NBD_OPT_EXPORT_NAME after extended headers were negotiated".to_owned(),
                    ));
                }
                let name = String::from_utf8_lossy(data).into_owned();
                let Some(e) = self.catalog.get(&name).cloned() else {
                    // No error reply is possible for this option: close.
                    return Err(SessionError::Protocol(format!("no export named {name:?}")));
                };
                let reply = proto::ExportNameReply {
                    size: e.size,
                    flags: self.flags(&e),
                };
                self.emit(&reply.encode(self.no_zeroes));
                // No block sizes were agreed.
                self.start(e, false, &name);
            }
            proto::OPT_ABORT => {
                self.reply(option, proto::REP_ACK, &[]);
                self.phase = Phase::Closed;
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    self.reply(option, proto::REP_ERR_INVALID, b"LIST takes no data");
                } else {
                    let names: Vec<String> = self.catalog.iter().map(|e| e.name.clone()).collect();
                    for name in names {
                        self.reply(option, proto::REP_SERVER, &proto::server_entry(&name));
                    }
                    self.reply(option, proto::REP_ACK, &[]);
                }
            }
            proto::OPT_INFO | proto::OPT_GO => self.info(option, data),
            proto::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        proto::REP_ERR_INVALID,
                        b"STRUCTURED_REPLY takes no data",
                    );
                } else if self.extended {
                    self.reply(
                        option,
                        proto::REP_ERR_INVALID,
                        b"extended headers are already negotiated",
                    );
                } else {
                    self.structured = true;
                    self.reply(option, proto::REP_ACK, &[]);
                }
            }
            proto::OPT_EXTENDED_HEADERS => {
                if !data.is_empty() {
                    self.reply(
                        option,
                        proto::REP_ERR_INVALID,
                        b"EXTENDED_HEADERS takes no data",
                    );
                } else {
                    self.extended = true;
                    self.structured = true;
                    self.reply(option, proto::REP_ACK, &[]);
                }
            }
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                self.meta_context(option, data);
            }
            other => {
                let msg = format!("option {other} is not supported");
                self.reply(option, proto::REP_ERR_UNSUP, msg.as_bytes());
            }
        }
        Ok(())
    }

    /// The export called `name`, or `NBD_REP_ERR_UNKNOWN` sent for `option`.
    pub(super) fn export_or_refuse(&mut self, option: u32, name: &str) -> Option<Arc<ExportEntry>> {
        let e = self.catalog.get(name).cloned();
        if e.is_none() {
            let msg = format!("no export named {name:?}");
            self.reply(option, proto::REP_ERR_UNKNOWN, msg.as_bytes());
        }
        e
    }

    pub(super) fn info(&mut self, option: u32, data: &[u8]) {
        let req = match InfoRequest::parse(data) {
            Ok(r) => r,
            Err(e) => {
                self.reply(option, proto::REP_ERR_INVALID, e.to_string().as_bytes());
                return;
            }
        };
        let Some(e) = self.export_or_refuse(option, &req.name) else {
            return;
        };
        let (min, pref, max) = self.block_sizes(&e);
        self.reply(
            option,
            proto::REP_INFO,
            &proto::info_export(e.size, self.flags(&e)),
        );
        self.reply(
            option,
            proto::REP_INFO,
            &proto::info_block_size(min, pref, max),
        );
        if req.requests.contains(&proto::INFO_NAME) {
            let d = proto::info_string(proto::INFO_NAME, &e.name);
            self.reply(option, proto::REP_INFO, &d);
        }
        if req.requests.contains(&proto::INFO_DESCRIPTION) && !e.description.is_empty() {
            let d = proto::info_string(proto::INFO_DESCRIPTION, &e.description);
            self.reply(option, proto::REP_INFO, &d);
        }
        self.reply(option, proto::REP_ACK, &[]);
        if option == proto::OPT_GO {
            let strict = req.requests.contains(&proto::INFO_BLOCK_SIZE);
            self.start(e, strict, &req.name);
        }
    }

    /// Enters transmission on export `e` (asked for as `asked`).
    pub(super) fn start(&mut self, e: Arc<ExportEntry>, strict: bool, asked: &str) {
        // Contexts count only if selected for the export that was then chosen.
        let same = self
            .contexts_for
            .as_deref()
            .is_some_and(|n| self.catalog.get(n).is_some_and(|x| Arc::ptr_eq(x, &e)));
        if !same || self.catalog.get(asked).is_none() {
            self.contexts.clear();
        }
        self.strict = strict;
        self.export = Some(e);
        self.phase = if self.stopping {
            Phase::Draining
        } else {
            Phase::Transmission
        };
    }

    pub(super) fn available_contexts(&self, e: &ExportEntry) -> Vec<Context> {
        let mut v = vec![Context::Allocation];
        if e.layout.is_some() {
            v.push(Context::Component);
        }
        v
    }

    pub(super) fn meta_context(&mut self, option: u32, data: &[u8]) {
        let set = option == proto::OPT_SET_META_CONTEXT;
        if set {
            // Replaced, even when this fails.
            self.contexts.clear();
            self.contexts_for = None;
        }
        if !self.structured {
            self.reply(
                option,
                proto::REP_ERR_INVALID,
                b"negotiate structured replies or extended headers first",
            );
            return;
        }
        let req = match MetaContextRequest::parse(data) {
            Ok(r) => r,
            Err(e) => {
                self.reply(option, proto::REP_ERR_INVALID, e.to_string().as_bytes());
                return;
            }
        };
        let Some(e) = self.export_or_refuse(option, &req.name) else {
            return;
        };
        let avail = self.available_contexts(&e);
        let mut chosen: Vec<Context> = Vec::new();
        if req.queries.is_empty() && !set {
            chosen = avail.clone();
        }
        for q in &req.queries {
            for &c in &avail {
                let (ns, _) = c.name().split_once(':').unwrap_or((c.name(), ""));
                let wildcard = !set && q.strip_suffix(':') == Some(ns);
                if (q == c.name() || wildcard) && !chosen.contains(&c) {
                    chosen.push(c);
                }
            }
        }
        for &c in &chosen {
            let id = if set { c.id() } else { 0 };
            self.reply(
                option,
                proto::REP_META_CONTEXT,
                &proto::meta_context(id, c.name()),
            );
        }
        self.reply(option, proto::REP_ACK, &[]);
        if set {
            self.contexts = chosen;
            self.contexts_for = Some(req.name);
        }
    }

    /// Transmission flags of export `e` for this connection.
    pub(super) fn flags(&self, e: &ExportEntry) -> u16 {
        let caps = e.caps;
        let mut f = proto::TF_HAS_FLAGS | proto::TF_CAN_MULTI_CONN | proto::TF_SEND_CACHE;
        // Flush and FUA are offered only if every component honours them (a read-only
        // export's flush is a no-op, and offered as other servers do).
        if e.read_only || caps.flush {
            f |= proto::TF_SEND_FLUSH;
        }
        if caps.rotational {
            f |= proto::TF_ROTATIONAL;
        }
        if self.structured {
            f |= proto::TF_SEND_DF;
        }
        if e.read_only {
            f |= proto::TF_READ_ONLY;
        } else {
            if caps.flush && caps.fua {
                f |= proto::TF_SEND_FUA;
            }
            f |= proto::TF_SEND_WRITE_ZEROES | proto::TF_SEND_FAST_ZERO;
            if caps.trim {
                f |= proto::TF_SEND_TRIM;
            }
        }
        f
    }

    /// Minimum, preferred and maximum block sizes: the logical block; the optimal I/O size
    /// (or the physical block), reduced to the largest power of two dividing it as the
    /// protocol requires (a 3-member stripe of 8 KiB units prefers 8 KiB, not 24); and the
    /// request cap rounded down to whole minimum blocks.
    pub(super) fn block_sizes(&self, e: &ExportEntry) -> (u32, u32, u32) {
        let l = &e.limits;
        let min = l.logical_block_size.clamp(512, 65536).next_power_of_two();
        let max = (self.config.max_request / min * min).max(min);
        let pref = if l.io_opt > 0 {
            l.io_opt
        } else {
            l.physical_block_size.max(4096)
        };
        let pref = (1u32 << pref.trailing_zeros()).clamp(min, max);
        let pref = if pref.is_power_of_two() {
            pref
        } else {
            1 << (31 - max.leading_zeros())
        };
        (min, pref, max)
    }
}
