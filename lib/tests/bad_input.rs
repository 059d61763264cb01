//! Bad input at every public entry point of the async stack: each gets a typed error, never
//! a panic or a hang, and nothing is written.

use std::sync::Arc;

use bytes::Bytes;
use tagstripe::quirks::QuirkSet;
use tagstripe::{BlockDevice, DeviceInfo, DynBlockDevice, Error, IoOpts, MemDevice, Volume};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn devices() -> Vec<(&'static str, Arc<dyn DynBlockDevice>)> {
    let mut four_k = DeviceInfo::new("4k", 4096);
    four_k.limits.logical_block_size = 4096;
    let comps = |n: usize| -> Vec<Arc<dyn DynBlockDevice>> {
        (0..n)
            .map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 2048)) as Arc<dyn DynBlockDevice>)
            .collect()
    };
    vec![
        ("mem", Arc::new(MemDevice::new("mem", 2048))),
        ("mem-4k", Arc::new(MemDevice::with_info(four_k))),
        (
            "volume",
            Arc::new(
                Volume::builder(comps(3))
                    .interleave(16)
                    .quirks(QuirkSet::empty())
                    .build()
                    .unwrap(),
            ),
        ),
    ]
}

#[test]
fn every_bad_request_is_a_typed_error_and_writes_nothing() {
    rt().block_on(async {
        for (name, d) in devices() {
            let size = d.info().sectors;
            let lbs = u64::from(d.info().limits.logical_block_size) / 512;
            let before = d.read(0, size, IoOpts::new()).await.unwrap();
            let w = |n: usize| Bytes::from(vec![0xEEu8; n]);
            let cases: Vec<(&str, tagstripe::Result<()>)> = vec![
                (
                    "zero-length read",
                    d.read(0, 0, IoOpts::new()).await.map(drop),
                ),
                (
                    "read past the end",
                    d.read(size, lbs, IoOpts::new()).await.map(drop),
                ),
                (
                    "read straddling the end",
                    d.read(size - lbs, 2 * lbs, IoOpts::new()).await.map(drop),
                ),
                (
                    "read overflowing",
                    d.read(u64::MAX, 1, IoOpts::new()).await.map(drop),
                ),
                (
                    "huge count",
                    d.read(0, u64::MAX, IoOpts::new()).await.map(drop),
                ),
                ("zero-length write", d.write(0, w(0), IoOpts::new()).await),
                (
                    "write of a partial sector",
                    d.write(0, w(100), IoOpts::new()).await,
                ),
                (
                    "write past the end",
                    d.write(size, w(512 * lbs as usize), IoOpts::new()).await,
                ),
                (
                    "write overflowing",
                    d.write(u64::MAX - 1, w(4096), IoOpts::new()).await,
                ),
                (
                    "discard past the end",
                    d.discard(size - lbs, 2 * lbs, IoOpts::new()).await,
                ),
                ("discard of nothing", d.discard(0, 0, IoOpts::new()).await),
                ("read_into a partial sector", {
                    let mut b = vec![0u8; 100];
                    d.read_into(0, &mut b, IoOpts::new()).await
                }),
            ];
            let mut cases = cases;
            if lbs > 1 {
                cases.push(("misaligned start", d.write(1, w(4096), IoOpts::new()).await));
                cases.push(("misaligned length", d.write(0, w(512), IoOpts::new()).await));
                cases.push((
                    "misaligned read",
                    d.read(0, 1, IoOpts::new()).await.map(drop),
                ));
            }
            for (what, r) in cases {
                match r {
                    Err(
                        Error::OutOfRange { .. }
                        | Error::Overflow { .. }
                        | Error::Misaligned { .. }
                        | Error::BadLength { .. },
                    ) => {}
                    other => panic!("{name}: {what}: expected a typed refusal, got {other:?}"),
                }
            }
            assert_eq!(
                d.read(0, size, IoOpts::new()).await.unwrap(),
                before,
                "{name}: data changed"
            );
        }
    });
}

#[test]
fn read_only_devices_refuse_every_change() {
    rt().block_on(async {
        let mut info = DeviceInfo::new("ro", 64);
        info.read_only = true;
        let d = MemDevice::with_info(info);
        assert!(matches!(
            d.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new()).await,
            Err(Error::ReadOnly { .. })
        ));
        assert!(matches!(
            d.flush(IoOpts::new()).await,
            Err(Error::ReadOnly { .. })
        ));
        assert!(matches!(
            d.discard(0, 1, IoOpts::new()).await,
            Err(Error::ReadOnly { .. })
        ));
        assert_eq!(d.read(0, 1, IoOpts::new()).await.unwrap(), vec![0u8; 512]);
    });
}

#[test]
fn volumes_that_cannot_be_built_are_refused() {
    let comps = |sizes: &[u64]| -> Vec<Arc<dyn DynBlockDevice>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| Arc::new(MemDevice::new(&format!("m{i}"), s)) as Arc<dyn DynBlockDevice>)
            .collect()
    };
    for (what, b) in [
        (
            "no components",
            Volume::builder(Vec::<Arc<dyn DynBlockDevice>>::new()),
        ),
        ("an empty component", Volume::builder(comps(&[0, 1024]))),
        (
            "interleave larger than a component",
            Volume::builder(comps(&[64, 64])).interleave(1 << 40),
        ),
        (
            "a mirror of an odd count",
            Volume::builder(comps(&[64, 64, 64])).mirror(true),
        ),
    ] {
        match b.quirks(QuirkSet::empty()).build() {
            Err(Error::Geometry(_) | Error::Limits(_) | Error::BadLength { .. }) => {}
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
    }
}
