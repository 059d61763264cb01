//! The checks and helpers every backend and layer shares: a request's bounds, buffers
//! cut into parts, zeroes written as buffers, pieces run to the end.

use bytes::Bytes;

use crate::{Error, Result};

use super::{BlockDevice, DeviceInfo, IoOpts, Zeroes};

/// Zero buffers for the emulated path, written in pieces of this size.
static ZERO_BUF: [u8; 1 << 20] = [0u8; 1 << 20];

/// The sectors a buffer of `len` bytes holds, or [`Error::BadLength`](crate::Error::BadLength).
pub(crate) fn sectors_of(info: &DeviceInfo, len: usize) -> Result<u64> {
    if len % 512 != 0 {
        return Err(Error::BadLength {
            device: info.name.clone(),
            what: format!("{len} bytes is not a whole number of sectors"),
        });
    }
    Ok(len as u64 / 512)
}

/// Zeroes by writing zero buffers (1 MiB pieces, whole logical blocks), or refuses with
/// [`Error::Unsupported`](crate::Error::Unsupported) if only a fast way would do.
pub(crate) async fn write_zero_buffers<D: BlockDevice + ?Sized>(
    dev: &D,
    start: u64,
    sectors: u64,
    z: Zeroes,
    opts: IoOpts,
) -> Result<()> {
    check_zeroes(dev.info(), start, sectors)?;
    if z.fast_only {
        return Err(Error::Unsupported {
            device: dev.info().name.clone(),
            op: "fast write-zeroes",
        });
    }
    let lbs = u64::from(dev.info().limits.logical_block_size / 512).max(1);
    let step = (ZERO_BUF.len() as u64 / 512) / lbs * lbs;
    let mut at = 0;
    while at < sectors {
        let n = step.min(sectors - at);
        let piece = Bytes::from_static(&ZERO_BUF[..n as usize * 512]);
        dev.write(start + at, piece, opts).await?;
        at += n;
    }
    Ok(())
}

/// Checks a write-zeroes request like a write of that many sectors.
pub(crate) fn check_zeroes(info: &DeviceInfo, start: u64, sectors: u64) -> Result<()> {
    let bytes = sectors
        .checked_mul(512)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::Overflow {
            device: info.name.clone(),
            start,
            sectors,
        })?;
    info.check_write(start, bytes).map(|_| ())
}

/// The bytes of a gathered write (`parts` one after the other), checked as a write of that
/// length at `start`: its sectors.
pub(crate) fn check_parts(info: &DeviceInfo, start: u64, parts: &[Bytes]) -> Result<u64> {
    for p in parts {
        sectors_of(info, p.len())?;
    }
    info.check_write(start, parts.iter().map(Bytes::len).sum())
}

/// The buffers of a scattered read (`bufs` one after the other), checked as a read of
/// that length at `start`: its sectors.
pub(crate) fn check_bufs(info: &DeviceInfo, start: u64, bufs: &[&mut [u8]]) -> Result<u64> {
    for b in bufs {
        sectors_of(info, b.len())?;
    }
    let sectors = sectors_of(info, bufs.iter().map(|b| b.len()).sum())?;
    info.check(start, sectors)?;
    Ok(sectors)
}

/// [`BlockDevice::write_piped`](crate::BlockDevice::write_piped)'s default (and the
/// backends' with `O_DIRECT`): the payload read into memory, written as one request.
pub(crate) async fn write_piped_from_memory<D: BlockDevice + ?Sized>(
    dev: &D,
    start: u64,
    data: crate::Piped,
    opts: IoOpts,
) -> Result<()> {
    let sectors = data.len() as u64 / 512;
    let bytes = data.into_bytes().map_err(|source| Error::Io {
        device: dev.info().name.clone(),
        op: "write",
        start,
        sectors,
        source,
    })?;
    dev.write(start, bytes, opts).await
}

/// [`BlockDevice::write_vectored`](crate::BlockDevice::write_vectored)'s default: the parts copied into one buffer, written as
/// one request.
pub(crate) async fn write_parts<D: BlockDevice + ?Sized>(
    dev: &D,
    start: u64,
    mut parts: Vec<Bytes>,
    opts: IoOpts,
) -> Result<()> {
    let sectors = check_parts(dev.info(), start, &parts)?;
    if parts.len() == 1 {
        let data = parts.pop().unwrap_or_default();
        return dev.write(start, data, opts).await;
    }
    let mut whole = Vec::with_capacity(sectors as usize * 512);
    for p in &parts {
        whole.extend_from_slice(p);
    }
    dev.write(start, Bytes::from(whole), opts).await
}

/// `dev`'s [`read_to_send`](BlockDevice::read_to_send) if `send`, else its
/// [`read`](BlockDevice::read): the two ways a layer's read into bytes goes down.
/// The device's own future, not one wrapped around it (every layer above holds it inline).
pub(crate) fn read_or_send<D: BlockDevice + ?Sized>(
    dev: &D,
    start: u64,
    sectors: u64,
    opts: IoOpts,
    send: bool,
) -> impl Future<Output = Result<Bytes>> + Send + '_ {
    if send {
        futures_util::future::Either::Left(dev.read_to_send(start, sectors, opts))
    } else {
        futures_util::future::Either::Right(dev.read(start, sectors, opts))
    }
}

/// Copies `whole` into `bufs`, one after the other (their lengths add up to at most its).
pub(crate) fn scatter(whole: &[u8], bufs: Vec<&mut [u8]>) {
    let mut at = 0;
    for b in bufs {
        let n = b.len();
        b.copy_from_slice(&whole[at..at + n]);
        at += n;
    }
}

/// Runs every piece of a request to the end, then reports the first error. Never returns
/// while a piece is still running: a piece abandoned at the first error could still land
/// after a later request (a discard zeroing a newer write), which would break ordering.
pub(crate) async fn all<T, F>(pieces: impl IntoIterator<Item = F>) -> Result<Vec<T>>
where
    F: Future<Output = Result<T>>,
{
    futures_util::future::join_all(pieces)
        .await
        .into_iter()
        .collect()
}
