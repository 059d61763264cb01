//! The component metadata decoder fed arbitrary bytes: two slots per component for up to
//! four components. Decoding never panics, whatever parses re-encodes to the same bytes,
//! and the assembly never trusts a component its own metadata, or the newest, calls stale.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe_striping::superblock::{self, Assembly, MAGIC, SIZE, Side, Superblock};

fuzz_target!(|data: &[u8]| {
    let Some((&n, data)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 4) + 1;
    // Each slot: the magic, then the input's bytes (so decoding gets past the magic often).
    let mut slots = Vec::new();
    for i in 0..2 * n {
        let mut b = vec![0u8; SIZE];
        b[..8].copy_from_slice(&MAGIC);
        let chunk = data.chunks(SIZE - 8).nth(i).unwrap_or(&[]);
        b[8..8 + chunk.len()].copy_from_slice(chunk);
        if let Ok(s) = Superblock::decode(&b) {
            assert_eq!(s.encode(), b, "decoded metadata re-encodes to itself");
        }
        slots.push(b);
    }
    let comps: Vec<Option<Superblock>> = (0..n)
        .map(|i| superblock::newest(&slots[2 * i], &slots[2 * i + 1]).ok().flatten())
        .collect();
    let geometry = comps.iter().flatten().next().map_or(0, |s| s.geometry);
    if let Ok(Assembly::Existing { stale, events, .. }) = superblock::assemble(&comps, geometry) {
        assert!(stale.len() < n, "some component is trusted");
        let winner = comps.iter().flatten().find(|s| s.events == events).unwrap();
        for (i, c) in comps.iter().enumerate() {
            let behind = c.as_ref().is_none_or(|c| c.events < events);
            if behind || winner.sides[i] != Side::InSync {
                assert!(stale.contains(&i), "component {i} is stale but trusted");
            }
        }
    }
});
