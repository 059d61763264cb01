//! The whole stack: a volume (concat, stripes, uniform or mirror) over memory devices behind
//! fault-injecting wrappers, driven by operations decoded from the input and checked against
//! a byte model. Every operation either matches the model or fails; a failed write or
//! discard leaves its sectors unknown until written again; with faults cleared, every known
//! sector reads back.
#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tagstripe::quirks::QuirkSet;
use tagstripe::striping::Flavor;
use tagstripe::{BlockDevice, DynBlockDevice, ByteModel, FaultDevice, FaultKind, IoOpts, MemDevice, Volume};

#[derive(Arbitrary, Debug)]
enum Op {
    Write { start: u16, len: u8, seed: u8 },
    Read { start: u16, len: u8, into: bool },
    Discard { start: u16, len: u8 },
    Flush,
    Faults { rate: u8, kind: u8, seed: u8 },
    Clear,
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    interleave: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let (sizes, flavor, mirror, uniform): (Vec<u64>, Flavor, bool, bool) = match input.kind % 4 {
        0 => (vec![300, 500, 200], Flavor::NetBsd, false, false),
        1 => (vec![300, 500, 200], Flavor::NetBsd, false, true),
        2 => (vec![400, 400], Flavor::FreeBsd, true, false),
        _ => (vec![256, 512], Flavor::NetBsd, false, false),
    };
    let interleave = if input.kind % 4 == 3 {
        0
    } else {
        u64::from(input.interleave % 64) + 1
    };
    let faults: Vec<Arc<FaultDevice<Arc<dyn DynBlockDevice>>>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let m: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new(&format!("m{i}"), s));
            Arc::new(FaultDevice::new(m))
        })
        .collect();
    let comps: Vec<Arc<dyn DynBlockDevice>> = faults
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn DynBlockDevice>)
        .collect();
    let Ok(vol) = Volume::builder(comps)
        .interleave(interleave)
        .flavor(flavor)
        .mirror(mirror)
        .uniform(uniform)
        .quirks(QuirkSet::empty())
        .build()
    else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let total = vol.info().sectors;
        let mut model = ByteModel::new(total);
        let span = |start: u16, len: u8| {
            let s = u64::from(start) % total;
            (s, u64::from(len).clamp(1, total - s))
        };
        for op in input.ops.into_iter().take(64) {
            match op {
                Op::Write { start, len, seed } => {
                    let (s, n) = span(start, len);
                    let bytes: Vec<u8> = (0..n * 512)
                        .map(|i| (i as u8).wrapping_mul(seed | 1))
                        .collect();
                    let r = vol
                        .write(s, Bytes::from(bytes.clone()), IoOpts::new())
                        .await;
                    model.write(s, &bytes, r.is_ok());
                }
                Op::Read { start, len, into } => {
                    let (s, n) = span(start, len);
                    let got = if into {
                        let mut b = vec![0u8; n as usize * 512];
                        vol.read_into(s, &mut b, IoOpts::new())
                            .await
                            .map(|()| Bytes::from(b))
                    } else {
                        vol.read(s, n, IoOpts::new()).await
                    };
                    if let Ok(got) = got {
                        assert_eq!(got.len() as u64, n * 512);
                        let c = model.check(s, &got);
                        assert!(c.mismatched.is_empty(), "sectors {:?}", c.mismatched);
                    }
                }
                Op::Discard { start, len } => {
                    let (s, n) = span(start, len);
                    let ok = vol.discard(s, n, IoOpts::new()).await.is_ok();
                    model.zero(s, n, ok);
                }
                Op::Flush => {
                    let _ = vol.flush(IoOpts::new()).await;
                }
                Op::Faults { rate, kind, seed } => {
                    let kind = match kind % 4 {
                        0 => FaultKind::Error,
                        1 => FaultKind::QueueFull,
                        2 => FaultKind::Busy,
                        _ => FaultKind::TornWrite,
                    };
                    let f = &faults[usize::from(seed) % faults.len()];
                    f.random(f64::from(rate) / 512.0, kind, u64::from(seed));
                }
                Op::Clear => faults.iter().for_each(|f| f.clear()),
            }
        }
        faults.iter().for_each(|f| f.clear());
        let all = vol
            .read(0, total, IoOpts::new())
            .await
            .expect("a read with no faults");
        let c = model.check(0, &all);
        assert!(c.mismatched.is_empty(), "final sectors {:?}", c.mismatched);
    });
});
