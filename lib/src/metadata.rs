//! A volume's on-disk metadata at work: reading each component's two copies at open,
//! writing new ones when a side is dropped (the format and the decision of whom to trust are
//! `tagstripe_striping::superblock`'s).

use bytes::Bytes;
use tagstripe_striping::superblock::{self, Side, Superblock};

use crate::layers::Striped;
use crate::{BlockDevice, Error, IoOpts, Result};

/// Sectors of one metadata copy.
const COPY_SECTORS: u64 = superblock::SIZE as u64 / 512;

/// Where component `dev`'s metadata area starts (its last sectors).
fn area(dev: &dyn BlockDevice) -> u64 {
    dev.info()
        .sectors
        .saturating_sub(superblock::RESERVED_SECTORS)
}

/// The metadata a component carries (see [`crate::VolumeBuilder::metadata`]): its newest
/// valid copy, `None` if it carries none.
///
/// ```
/// use tagstripe::{component_metadata, MemDevice};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert_eq!(component_metadata(&MemDevice::new("m", 64)).await?, None);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// I/O errors reading the component's last 16 sectors; [`Error::Metadata`] if both copies
/// are there but neither is usable (torn or corrupt).
pub async fn component_metadata(dev: &dyn BlockDevice) -> Result<Option<Superblock>> {
    read(dev).await
}

/// The newest valid copy on `dev`, `None` if it carries none.
pub(crate) async fn read(dev: &dyn BlockDevice) -> Result<Option<Superblock>> {
    if dev.info().sectors < superblock::RESERVED_SECTORS {
        return Ok(None);
    }
    let at = area(dev);
    let b = dev
        .read(at, superblock::RESERVED_SECTORS, IoOpts::new())
        .await?;
    let (s0, s1) = b.split_at(superblock::SIZE);
    Ok(superblock::newest(s0, s1)?)
}

/// Writes `sb` to its slot on `dev`, durably (FUA).
async fn write(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let at = area(dev) + sb.slot() as u64 * COPY_SECTORS;
    dev.write(at, Bytes::from(sb.encode()), IoOpts::new().fua(true))
        .await
}

/// Keeps a volume's metadata: its identity and the event count last written.
#[derive(Debug)]
pub(crate) struct Keeper {
    uuid: [u8; 16],
    fingerprint: u64,
    events: tokio::sync::Mutex<u64>,
    /// The dropped sides as last written durably (empty before the first write).
    written: parking_lot::Mutex<Vec<bool>>,
}

impl Keeper {
    pub(crate) fn new(uuid: [u8; 16], fingerprint: u64, events: u64) -> Self {
        Self {
            uuid,
            fingerprint,
            events: tokio::sync::Mutex::new(events),
            written: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Whether the sides dropped in memory differ from what was last written durably (a
    /// persist that failed): then no write may be acknowledged until it is written.
    pub(crate) fn behind(&self, s: &Striped) -> bool {
        let w = self.written.lock();
        (0..s.components().len()).any(|i| w.get(i).copied().unwrap_or(false) != s.is_failed(i))
    }

    /// Writes the volume's present state (which sides are dropped) to every live component
    /// with the next event count; returns once it is durable everywhere. One at a time.
    ///
    /// # Errors
    /// The first component that cannot take it (named): then the state change is not
    /// durable, and the write that caused it must not be acknowledged.
    pub(crate) async fn persist(&self, s: &Striped) -> Result<()> {
        let mut events = self.events.lock().await;
        let next = *events + 1;
        let n = s.components().len();
        let failed: Vec<bool> = (0..n).map(|i| s.is_failed(i)).collect();
        let sides: Vec<Side> = (0..n)
            .map(|i| {
                if s.is_failed(i) {
                    Side::Failed
                } else {
                    Side::InSync
                }
            })
            .collect();
        for (i, c) in s.components().iter().enumerate() {
            if s.is_failed(i) {
                continue;
            }
            let sb = Superblock {
                uuid: self.uuid,
                events: next,
                role: i as u32,
                geometry: self.fingerprint,
                data_sectors: area(c.as_ref()),
                dirty: false,
                sides: sides.clone(),
                resync_from: 0,
            };
            write(c.as_ref(), &sb).await.map_err(|e| Error::Component {
                component: i,
                volume_sector: None,
                source: Box::new(e),
            })?;
        }
        *events = next;
        *self.written.lock() = failed;
        tracing::info!(
            target: "tagstripe::mirror",
            volume = %s.info().name,
            events = next,
            failed = ?s.failed_components(),
            "metadata written"
        );
        Ok(())
    }
}

/// The mirror partner of component `i` (ccd mirrors the first half onto the second).
fn partner(s: &Striped, i: usize) -> usize {
    let half = s.components().len() / 2;
    if i < half { i + half } else { i - half }
}

/// A new volume's identity: 16 bytes from the process's random hashing keys, the time and
/// the process id (no crate for sixteen random bytes).
pub(crate) fn new_uuid() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now);
        h.write_u32(std::process::id());
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Opens `s`'s metadata: a new volume gets its first copies on every component; an existing
/// one has its stale components marked (never read) and keeps its metadata from then on.
///
/// # Errors
/// [`Error::Metadata`] for components that do not belong (named), a stripe or
/// concatenation member that is stale (it has no partner to serve from), or I/O errors on a
/// component (named).
pub(crate) async fn open(s: &Striped) -> Result<()> {
    let mut found = Vec::with_capacity(s.components().len());
    for (i, c) in s.components().iter().enumerate() {
        found.push(read(c.as_ref()).await.map_err(|e| Error::Component {
            component: i,
            volume_sector: None,
            source: Box::new(e),
        })?);
    }
    let fingerprint = superblock::fingerprint(s.geometry());
    match superblock::assemble(&found, fingerprint)? {
        superblock::Assembly::New => {
            s.keep(Keeper::new(new_uuid(), fingerprint, 0));
        }
        superblock::Assembly::Existing {
            uuid,
            events,
            stale,
        } => {
            if !stale.is_empty() && !s.geometry().is_mirror() {
                return Err(Error::Metadata(superblock::MetadataError::Invalid {
                    field: "sides",
                    what: format!(
                        "components {stale:?} are stale, and a volume without a mirror has no other copy"
                    ),
                }));
            }
            for &i in &stale {
                s.mark_failed(i);
                tracing::warn!(
                    target: "tagstripe::mirror",
                    volume = %s.info().name,
                    component = i,
                    "component is stale (its metadata is behind the volume's): not read"
                );
            }
            s.keep(Keeper::new(uuid, fingerprint, events));
        }
    }
    // Write the state found (or the new volume's first copies) before serving. A mirror
    // side that cannot take it is dropped (recorded on its partner) as a failed write would
    // be; with no side left to record on, the volume does not open.
    let Some(k) = s.keeper() else {
        return Ok(());
    };
    loop {
        match k.persist(s).await {
            Ok(()) => return Ok(()),
            Err(Error::Component {
                component, source, ..
            }) if s.geometry().is_mirror() && !s.is_failed(partner(s, component)) => {
                tracing::warn!(
                    target: "tagstripe::mirror",
                    volume = %s.info().name,
                    component,
                    error = %source,
                    "mirror side dropped at open: it cannot take the volume's metadata"
                );
                s.mark_failed(component);
            }
            Err(e) => return Err(e),
        }
    }
}
