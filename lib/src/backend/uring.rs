//! An io_uring backend (feature `uring`): the file backend's semantics without a thread
//! handoff per request.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use io_uring::{IoUring, opcode, types};
use tokio::sync::oneshot;

use super::file::{needs_copy, read_buffer};
use crate::{BlockDevice, DeviceInfo, Error, FileDevice, FileOptions, IoOpts, Result};

enum Job {
    Read {
        offset: u64,
        len: usize,
        reply: oneshot::Sender<io::Result<Bytes>>,
    },
    Write {
        offset: u64,
        data: Bytes,
        sync: bool,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Fsync {
        reply: oneshot::Sender<io::Result<()>>,
    },
    Discard {
        offset: u64,
        len: u64,
        reply: oneshot::Sender<io::Result<()>>,
    },
}

/// A request in the ring: its buffer lives here until its completion is reaped.
enum InFlight {
    Read {
        buf: Vec<u8>,
        off: usize,
        len: usize,
        reply: oneshot::Sender<io::Result<Bytes>>,
    },
    Write {
        _data: Bytes,
        len: usize,
        then_sync: bool,
        reply: oneshot::Sender<io::Result<()>>,
    },
    Fsync {
        reply: oneshot::Sender<io::Result<()>>,
    },
}

/// A file or block device driven through io_uring by a thread that owns the ring: the same
/// semantics as [`FileDevice`] (positional I/O, optional `O_DIRECT`, flush = fdatasync, FUA
/// = write then fdatasync, discard = punch hole). Where io_uring is unavailable (old kernel, seccomp, disabled),
/// opening fails with [`Error::Unsupported`].
#[derive(Debug)]
pub struct UringDevice {
    info: DeviceInfo,
    jobs: mpsc::Sender<Job>,
}

impl UringDevice {
    /// Opens `path` (a file, or a block device if `block`) with a ring of `depth` entries.
    ///
    /// # Errors
    /// As [`FileDevice::open`] / [`FileDevice::open_block`]; [`Error::Unsupported`] when
    /// io_uring cannot be set up here.
    pub fn open(
        path: impl AsRef<Path>,
        opts: FileOptions,
        block: bool,
        depth: u32,
    ) -> Result<Self> {
        let path = path.as_ref();
        let probe = if block {
            FileDevice::open_block(path, opts)?
        } else {
            FileDevice::open(path, opts)?
        };
        let info = probe.info().clone();
        let file = probe.into_file().map_err(|e| Error::Io {
            device: info.name.clone(),
            op: "open",
            start: 0,
            sectors: 0,
            source: e,
        })?;
        let ring = IoUring::new(depth.max(2)).map_err(|_| Error::Unsupported {
            device: info.name.clone(),
            op: "io_uring",
        })?;
        let (tx, rx) = mpsc::channel();
        let direct = opts.direct;
        std::thread::Builder::new()
            .name(format!("uring:{}", info.name))
            .spawn(move || run(ring, file, rx, direct))
            .map_err(|e| Error::Io {
                device: info.name.clone(),
                op: "spawn",
                start: 0,
                sectors: 0,
                source: e,
            })?;
        Ok(Self { info, jobs: tx })
    }

    /// Sends a job built around a reply channel and waits for the answer.
    async fn ask<T>(
        &self,
        op: &'static str,
        start: u64,
        sectors: u64,
        job: impl FnOnce(oneshot::Sender<io::Result<T>>) -> Job,
    ) -> Result<T> {
        let closed = || Error::Closed {
            device: self.info.name.clone(),
        };
        let (reply, rx) = oneshot::channel();
        self.jobs.send(job(reply)).map_err(|_| closed())?;
        rx.await
            .map_err(|_| closed())?
            .map_err(self.io(op, start, sectors))
    }

    fn io(&self, op: &'static str, start: u64, sectors: u64) -> impl Fn(io::Error) -> Error + '_ {
        move |source| Error::Io {
            device: self.info.name.clone(),
            op,
            start,
            sectors,
            source,
        }
    }
}

fn ring_len(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// The ring's thread: takes jobs, submits them, reaps completions, answers.
fn run(mut ring: IoUring, file: File, jobs: mpsc::Receiver<Job>, direct: bool) {
    let fd = types::Fd(file.as_raw_fd());
    let mut inflight: HashMap<u64, InFlight> = HashMap::new();
    let mut next: u64 = 0;
    let mut closed = false;
    loop {
        // New work: block when idle, otherwise take what is there.
        let job = if inflight.is_empty() {
            if closed {
                return;
            }
            match jobs.recv() {
                Ok(j) => Some(j),
                Err(_) => return,
            }
        } else {
            match jobs.try_recv() {
                Ok(j) => Some(j),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => {
                    closed = true;
                    None
                }
            }
        };
        if let Some(job) = job {
            let id = next;
            next = next.wrapping_add(1);
            let (entry, state) = match job {
                Job::Read { offset, len, reply } => {
                    let (mut buf, off) = read_buffer(len, direct);
                    let Ok(n) = ring_len(len) else {
                        let _ = reply.send(Err(io::Error::from(io::ErrorKind::InvalidInput)));
                        continue;
                    };
                    let ptr = buf[off..].as_mut_ptr();
                    let e = opcode::Read::new(fd, ptr, n)
                        .offset(offset)
                        .build()
                        .user_data(id);
                    (
                        e,
                        InFlight::Read {
                            buf,
                            off,
                            len,
                            reply,
                        },
                    )
                }
                Job::Write {
                    offset,
                    data,
                    sync,
                    reply,
                } => {
                    let len = data.len();
                    // The caller's bytes go to the ring as they are, unless O_DIRECT needs
                    // them aligned.
                    let data = if needs_copy(&data, direct) {
                        let (mut v, off) = read_buffer(len, true);
                        v[off..off + len].copy_from_slice(&data);
                        Bytes::from(v).slice(off..off + len)
                    } else {
                        data
                    };
                    let Ok(n) = ring_len(len) else {
                        let _ = reply.send(Err(io::Error::from(io::ErrorKind::InvalidInput)));
                        continue;
                    };
                    let e = opcode::Write::new(fd, data.as_ptr(), n)
                        .offset(offset)
                        .build()
                        .user_data(id);
                    (
                        e,
                        InFlight::Write {
                            _data: data,
                            len,
                            then_sync: sync,
                            reply,
                        },
                    )
                }
                Job::Fsync { reply } => {
                    let e = opcode::Fsync::new(fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data(id);
                    (e, InFlight::Fsync { reply })
                }
                Job::Discard { offset, len, reply } => {
                    let e = opcode::Fallocate::new(fd, len)
                        .offset(offset)
                        .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                        .build()
                        .user_data(id);
                    (e, InFlight::Fsync { reply })
                }
            };
            inflight.insert(id, state);
            // SAFETY: the entry points into a heap buffer (a `Vec`'s or a `Bytes`') owned by
            // `inflight[id]`; moving the owner does not move the heap buffer, and the owner is
            // kept until the completion carrying `id` is reaped below. The fd belongs to
            // `file`, alive for the whole loop. Exercised by the uring tests.
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_err() {
                // The queue is full: submit what is there, then push again.
                let _ = ring.submit();
                // SAFETY: as above.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    if let Some(state) = inflight.remove(&id) {
                        fail(state, io::Error::from(io::ErrorKind::WouldBlock));
                    }
                }
            }
            // Take every job already waiting before submitting (one syscall for many).
            continue;
        }
        if inflight.is_empty() {
            continue;
        }
        // Wait for at least one completion, but not so long that new jobs starve.
        let ts = types::Timespec::from(Duration::from_micros(200));
        let args = types::SubmitArgs::new().timespec(&ts);
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if e.raw_os_error() == Some(libc::ETIME)
                    || e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => {
                for (_, state) in inflight.drain() {
                    fail(state, io::Error::new(e.kind(), e.to_string()));
                }
                continue;
            }
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in done {
            let Some(state) = inflight.remove(&id) else {
                continue;
            };
            if res < 0 {
                fail(state, io::Error::from_raw_os_error(-res));
                continue;
            }
            let n = res as usize;
            match state {
                InFlight::Read {
                    buf,
                    off,
                    len,
                    reply,
                } => {
                    let r = if n == len {
                        Ok(Bytes::from(buf).slice(off..off + len))
                    } else {
                        Err(io::Error::from(io::ErrorKind::UnexpectedEof))
                    };
                    let _ = reply.send(r);
                }
                InFlight::Write {
                    len,
                    then_sync,
                    reply,
                    ..
                } => {
                    let r = if n != len {
                        Err(io::Error::from(io::ErrorKind::WriteZero))
                    } else if then_sync {
                        file.sync_data()
                    } else {
                        Ok(())
                    };
                    let _ = reply.send(r);
                }
                InFlight::Fsync { reply } => {
                    let _ = reply.send(Ok(()));
                }
            }
        }
    }
}

fn fail(state: InFlight, e: io::Error) {
    match state {
        InFlight::Read { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        InFlight::Write { reply, .. } | InFlight::Fsync { reply } => {
            let _ = reply.send(Err(e));
        }
    }
}

#[async_trait]
impl BlockDevice for UringDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    async fn read(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<Bytes> {
        self.info.check(start, sectors)?;
        let (offset, len) = (start * 512, sectors as usize * 512);
        self.ask("read", start, sectors, |reply| Job::Read {
            offset,
            len,
            reply,
        })
        .await
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        let (offset, sync) = (start * 512, opts.fua);
        self.ask("write", start, sectors, |reply| Job::Write {
            offset,
            data,
            sync,
            reply,
        })
        .await
    }

    async fn flush(&self, _opts: IoOpts) -> Result<()> {
        if self.info.read_only {
            return Err(Error::ReadOnly {
                device: self.info.name.clone(),
            });
        }
        self.ask("flush", 0, 0, |reply| Job::Fsync { reply }).await
    }

    async fn discard(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<()> {
        self.info.check_discard(start, sectors)?;
        let (offset, len) = (start * 512, sectors * 512);
        self.ask("discard", start, sectors, |reply| Job::Discard {
            offset,
            len,
            reply,
        })
        .await
    }
}
