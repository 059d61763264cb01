//! The tenant scheduler against a device of fixed capacity on a virtual clock: reservations
//! met when they fit, limits never exceeded over any window (beyond the burst), spare capacity
//! split by weight, an idle tenant back with no catch-up, work conserved; random tenant sets
//! and arrival patterns.

use proptest::prelude::*;
use tagstripe_scheduler::{Idle, IoClass, Nanos, TenantId, TenantScheduler, TenantSpec};

const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000_000_000;

/// How a tenant sends: always `depth` requests queued, or one every `gap` ns from `from`.
#[derive(Clone, Copy, Debug)]
enum Load {
    Saturating { depth: usize },
    Periodic { gap: Nanos, from: Nanos },
}

/// Runs `tenants` on a device that serves one 4 KiB request every `service` ns for
/// `duration`; returns each dispatch's (time, tenant).
fn run(
    tenants: &[(TenantSpec, Load)],
    service: Nanos,
    duration: Nanos,
) -> (Vec<(Nanos, usize)>, TenantScheduler<u64>) {
    let mut s = TenantScheduler::new();
    let ids: Vec<TenantId> = tenants
        .iter()
        .map(|(spec, _)| s.add(*spec).unwrap())
        .collect();
    let mut queued = vec![0usize; tenants.len()];
    let mut next_arrival: Vec<Nanos> = tenants
        .iter()
        .map(|(_, l)| match l {
            Load::Saturating { .. } => 0,
            Load::Periodic { from, .. } => *from,
        })
        .collect();
    let mut out = Vec::new();
    let mut now = 0;
    let mut seq = 0u64;
    while now < duration {
        for (i, (_, load)) in tenants.iter().enumerate() {
            match *load {
                Load::Saturating { depth } => {
                    while queued[i] < depth {
                        s.submit(now, ids[i], seq, 4096, IoClass::BestEffort)
                            .unwrap();
                        seq += 1;
                        queued[i] += 1;
                    }
                }
                Load::Periodic { gap, .. } => {
                    while next_arrival[i] <= now {
                        s.submit(next_arrival[i], ids[i], seq, 4096, IoClass::BestEffort)
                            .unwrap();
                        seq += 1;
                        queued[i] += 1;
                        next_arrival[i] += gap;
                    }
                }
            }
        }
        match s.next(now) {
            Ok(d) => {
                queued[d.tenant.0] -= 1;
                out.push((now, d.tenant.0));
                now += service;
            }
            Err(Idle::Until(t)) => {
                // Work conserved: only when every tenant with work is over its limit.
                assert!(t > now);
                let soonest = next_arrival
                    .iter()
                    .zip(tenants)
                    .filter(|(_, (_, l))| matches!(l, Load::Periodic { .. }))
                    .map(|(a, _)| *a)
                    .min()
                    .unwrap_or(Nanos::MAX);
                now = t.min(soonest.max(now + 1));
            }
            Err(Idle::Empty) => {
                let soonest = next_arrival
                    .iter()
                    .zip(tenants)
                    .filter(|(_, (_, l))| matches!(l, Load::Periodic { .. }))
                    .map(|(a, _)| *a)
                    .min()
                    .unwrap_or(duration);
                now = soonest.max(now + 1);
            }
        }
    }
    (out, s)
}

fn served(out: &[(Nanos, usize)], tenant: usize, from: Nanos, to: Nanos) -> usize {
    out.iter()
        .filter(|(t, i)| *i == tenant && *t >= from && *t < to)
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    /// Reservations that fit the capacity (together under 80% of it) are met, whatever the
    /// weights of the others (up to 1000x the reserved tenants').
    #[test]
    fn reservations_are_met_when_they_fit(
        reserves in proptest::collection::vec(50u32..400, 1..4),
        others in proptest::collection::vec(1u32..=10_000, 1..3),
    ) {
        let capacity = 2_000u64; // IOPS
        prop_assume!(reserves.iter().map(|&r| u64::from(r)).sum::<u64>() * 10 <= capacity * 8);
        let mut tenants: Vec<(TenantSpec, Load)> = reserves
            .iter()
            .map(|&r| (TenantSpec::new().weight(1).reserve_iops(f64::from(r)), Load::Saturating { depth: 4 }))
            .collect();
        tenants.extend(others.iter().map(|&w| (TenantSpec::new().weight(w), Load::Saturating { depth: 8 })));
        let (out, _) = run(&tenants, SEC / capacity, 2 * SEC);
        for (i, &r) in reserves.iter().enumerate() {
            let got = served(&out, i, 0, 2 * SEC);
            prop_assert!(got as f64 >= 0.95 * 2.0 * f64::from(r), "tenant {i}: {got} served, {r}/s reserved");
        }
    }

    /// A limited tenant never gets more than its limit over any 100 ms window, beyond its
    /// burst (10 ms of its rate) and one request, even alone on the device.
    #[test]
    fn limits_hold_over_every_window(limit in 50u32..1_500, others in 0usize..3) {
        let capacity = 2_000u64;
        let mut tenants = vec![(TenantSpec::new().limit_iops(f64::from(limit)), Load::Saturating { depth: 8 })];
        for _ in 0..others {
            tenants.push((TenantSpec::new(), Load::Saturating { depth: 8 }));
        }
        let (out, s) = run(&tenants, SEC / capacity, 2 * SEC);
        let window = 100 * MS;
        let allowed = f64::from(limit) * 0.110 + 1.0;
        let mut from = 0;
        while from + window <= 2 * SEC {
            let got = served(&out, 0, from, from + window);
            prop_assert!(got as f64 <= allowed, "{got} in [{from}, +100 ms), limit {limit}/s");
            from += 10 * MS;
        }
        // And it is not starved below its limit when the device has room.
        let total = served(&out, 0, 0, 2 * SEC) as f64;
        if others == 0 || u64::from(limit) * (others as u64 + 1) < capacity {
            prop_assert!(total >= 0.95 * 2.0 * f64::from(limit), "{total} for limit {limit}");
        }
        // Held back by the limit (counted) whenever its share would be clearly above it
        // (within 10% of its share, the burst may absorb what the limit would hold).
        if u64::from(limit) * (others as u64 + 1) * 11 < capacity * 10 {
            prop_assert!(s.counters(TenantId(0)).unwrap().throttled > 0);
        }
    }

    /// Saturating tenants with weights only split the device by weight (within 3%).
    #[test]
    fn spare_capacity_is_split_by_weight(weights in proptest::collection::vec(1u32..=10_000, 2..5)) {
        let tenants: Vec<(TenantSpec, Load)> = weights
            .iter()
            .map(|&w| (TenantSpec::new().weight(w), Load::Saturating { depth: 8 }))
            .collect();
        let (out, _) = run(&tenants, SEC / 10_000, SEC);
        let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
        let n = out.len() as f64;
        for (i, &w) in weights.iter().enumerate() {
            let want = n * f64::from(w) / total;
            let got = served(&out, i, 0, SEC) as f64;
            prop_assert!((got - want).abs() <= 0.03 * n + 2.0, "tenant {i} (weight {w}): {got}, owed {want:.0}");
        }
    }

    /// A tenant idle for a while comes back with its share, not a catch-up burst: in the
    /// first 50 ms after it returns it gets no more than its weight's share (plus 3%).
    #[test]
    fn an_idle_tenant_comes_back_without_a_burst(wa in 1u32..1_000, wb in 1u32..1_000, away in 100u64..900) {
        let back = away * MS;
        let tenants = vec![
            (TenantSpec::new().weight(wa), Load::Saturating { depth: 8 }),
            // B sends far faster than the device serves, from `back` on.
            (TenantSpec::new().weight(wb), Load::Periodic { gap: SEC / 100_000, from: back }),
        ];
        let (out, _) = run(&tenants, SEC / 10_000, back + 200 * MS);
        let window = 50 * MS;
        let n = out.iter().filter(|(t, _)| *t >= back && *t < back + window).count() as f64;
        let got = served(&out, 1, back, back + window) as f64;
        let share = f64::from(wb) / f64::from(wa + wb);
        prop_assert!(got <= n * (share + 0.03) + 2.0, "{got} of {n} right after return, share {share:.2}");
    }
}

#[test]
fn bad_specs_are_refused_with_what_is_wrong() {
    let mut s = TenantScheduler::<u64>::new();
    for (spec, want) in [
        (TenantSpec::new().weight(0), "weight 0"),
        (TenantSpec::new().weight(10_001), "weight 10001"),
        (TenantSpec::new().reserve_iops(-1.0), "reserve-iops"),
        (TenantSpec::new().limit_bps(f64::NAN), "limit-bps"),
        (
            TenantSpec::new().reserve_iops(500.0).limit_iops(100.0),
            "reservation 500 is above the limit 100",
        ),
    ] {
        let e = s.add(spec).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    assert!(s.add(TenantSpec::new()).is_ok());
    assert!(s.submit(0, TenantId(7), 1, 4096, IoClass::Bulk).is_err());
    assert_eq!(s.next(0).unwrap_err(), Idle::Empty);
}

#[test]
fn within_a_tenant_interactive_requests_go_first_and_specs_change_at_run_time() {
    let mut s = TenantScheduler::new();
    let t = s.add(TenantSpec::new()).unwrap();
    for i in 0..10u64 {
        s.submit(0, t, i, 65_536, IoClass::Bulk).unwrap();
    }
    s.submit(0, t, 99, 4096, IoClass::Interactive).unwrap();
    assert_eq!(s.next(0).unwrap().req, 99);
    // A limit set now holds from the next request on.
    s.set(t, TenantSpec::new().limit_iops(10.0)).unwrap();
    let mut now = 0;
    let mut served = 0;
    while now < SEC {
        match s.next(now) {
            Ok(_) => served += 1,
            Err(Idle::Until(u)) => now = u,
            Err(Idle::Empty) => break,
        }
    }
    assert!(served <= 11, "{served} in a second at 10/s");
}

#[test]
fn byte_rates_count_bytes() {
    // 1 MB/s reserved, 64 KiB requests: about 15 a second, against a heavy neighbour.
    let tenants = [
        (
            TenantSpec::new().weight(1).reserve_bps(1e6),
            Load::Saturating { depth: 4 },
        ),
        (
            TenantSpec::new().weight(10_000),
            Load::Saturating { depth: 8 },
        ),
    ];
    let mut s = TenantScheduler::new();
    let ids: Vec<TenantId> = tenants
        .iter()
        .map(|(spec, _)| s.add(*spec).unwrap())
        .collect();
    let mut now = 0;
    let mut got = [0u64; 2];
    let mut q = [0usize; 2];
    while now < 2 * SEC {
        for i in 0..2 {
            while q[i] < 4 {
                s.submit(now, ids[i], 0, 65_536, IoClass::BestEffort)
                    .unwrap();
                q[i] += 1;
            }
        }
        let d = s.next(now).unwrap();
        q[d.tenant.0] -= 1;
        got[d.tenant.0] += 65_536;
        now += 100_000; // 10,000 requests a second
    }
    let mbs = got[0] as f64 / 2.0 / 1e6;
    assert!((0.95..1.3).contains(&mbs), "{mbs} MB/s for 1 MB/s reserved");
}

#[test]
fn a_cancelled_request_is_never_served_and_costs_nothing() {
    let mut s = TenantScheduler::new();
    let t = s.add(TenantSpec::new().limit_iops(10.0)).unwrap();
    for i in 0..5u64 {
        s.submit(0, t, i, 4096, IoClass::BestEffort).unwrap();
    }
    assert!(s.cancel(t, &0) && s.cancel(t, &3));
    assert!(!s.cancel(t, &3), "not twice");
    assert!(!s.cancel(TenantId(9), &1));
    assert_eq!(s.len(), 3);
    let mut got = Vec::new();
    let mut now = 0;
    while got.len() < 3 {
        match s.next(now) {
            Ok(d) => got.push(d.req),
            Err(Idle::Until(u)) => now = u,
            Err(Idle::Empty) => break,
        }
    }
    assert_eq!(got, [1, 2, 4]);
    // Three served at 10/s (a 10 ms burst): the last no later than 200 ms in.
    assert!(now <= 200 * MS, "{now}");
}

/// Two closed-loop tenants of unlike requests (16 KiB reads, 16 outstanding; 1 MiB writes,
/// 16 outstanding) at weights 3 and 1 through a device that holds `depth` at once, each
/// request taking its own time there: the cost served splits 3:1 (both always backlogged).
#[test]
fn closed_loop_tenants_of_unlike_sizes_split_by_weight() {
    let mut s = TenantScheduler::new();
    let db = s.add(TenantSpec::new().weight(3)).unwrap();
    let bk = s.add(TenantSpec::new().weight(1)).unwrap();
    let sizes = [16u64 << 10, 1 << 20];
    let service: [Nanos; 2] = [10_000_000, 3_000_000];
    let mut id = 0u64;
    let mut tenant_of = std::collections::HashMap::new();
    for (k, t) in [db, bk].into_iter().enumerate() {
        for _ in 0..16 {
            s.submit(0, t, id, sizes[k], IoClass::BestEffort).unwrap();
            tenant_of.insert(id, k);
            id += 1;
        }
    }
    let depth = 12;
    // (completion time, request)
    let mut at_device: Vec<(Nanos, u64)> = Vec::new();
    let mut cost = [0.0f64; 2];
    let mut now: Nanos = 0;
    for _ in 0..20_000 {
        while at_device.len() < depth {
            let d = s.next(now).unwrap();
            let k = tenant_of[&d.req];
            cost[k] += tagstripe_scheduler::weight_cost(sizes[k]);
            at_device.push((now + service[k], d.req));
        }
        at_device.sort_unstable();
        let (t, req) = at_device.remove(0);
        now = t;
        let k = tenant_of[&req];
        s.submit(now, [db, bk][k], id, sizes[k], IoClass::BestEffort)
            .unwrap();
        tenant_of.insert(id, k);
        id += 1;
    }
    let ratio = cost[0] / cost[1];
    assert!((2.9..=3.1).contains(&ratio), "{ratio}");
}

/// A closed loop of two tenants at weights 3 and 1, 16 requests each outstanding, the
/// second limited to `limit_bps`, through a device that holds 8 at once and takes
/// `service` ns over each of `size` bytes: the cost served to each and the time taken.
fn closed_loop_with_limit(
    sizes: [u64; 2],
    service: [Nanos; 2],
    limit_bps: f64,
) -> ([f64; 2], Nanos) {
    let mut s = TenantScheduler::new();
    let a = s.add(TenantSpec::new().weight(3)).unwrap();
    let b = s
        .add(TenantSpec::new().weight(1).limit_bps(limit_bps))
        .unwrap();
    let mut id = 0u64;
    let mut tenant_of = std::collections::HashMap::new();
    for k in 0..2 {
        for _ in 0..16 {
            s.submit(0, [a, b][k], id, sizes[k], IoClass::BestEffort)
                .unwrap();
            tenant_of.insert(id, k);
            id += 1;
        }
    }
    let mut at_device: Vec<(Nanos, u64)> = Vec::new();
    let mut cost = [0.0f64; 2];
    let mut now: Nanos = 0;
    while now < 20_000_000_000 {
        while at_device.len() < 8 {
            match s.next(now) {
                Ok(d) => {
                    let k = tenant_of[&d.req];
                    cost[k] += tagstripe_scheduler::weight_cost(sizes[k]);
                    at_device.push((now + service[k], d.req));
                }
                Err(Idle::Until(t)) => {
                    if at_device.is_empty() {
                        now = t;
                    } else {
                        break;
                    }
                }
                Err(Idle::Empty) => break,
            }
        }
        at_device.sort_unstable();
        let (t, req) = at_device.remove(0);
        now = now.max(t);
        let k = tenant_of[&req];
        s.submit(now, [a, b][k], id, sizes[k], IoClass::BestEffort)
            .unwrap();
        tenant_of.insert(id, k);
        id += 1;
    }
    (cost, now)
}

#[test]
fn a_limit_above_the_share_by_weight_does_not_lift_the_tenant_above_it() {
    // 64 KiB at 1 ms, 8 at once: 524 MB/s, a quarter of it 131 MB/s; a limit of 300 MB/s
    // does not bind, the weights decide.
    let (cost, _) = closed_loop_with_limit([64 << 10; 2], [1_000_000; 2], 300e6);
    let ratio = cost[0] / cost[1];
    assert!((2.9..=3.1).contains(&ratio), "{ratio}");
    // Unlike requests (16 KiB reads at 10 ms, 1 MiB writes at 20 ms), the second's limit
    // above its share by weight but each of its requests more than its burst.
    let (cost, _) = closed_loop_with_limit([16 << 10, 1 << 20], [10_000_000, 20_000_000], 24e6);
    let ratio = cost[0] / cost[1];
    assert!((2.9..=3.1).contains(&ratio), "{ratio}");
    // A limit of 50 MB/s binds: the tenant gets it, the other the rest.
    let (cost, now) = closed_loop_with_limit([64 << 10; 2], [1_000_000; 2], 50e6);
    let mbs = cost[1] / 2.0 * 65_536.0 / (now as f64 / 1e9) / 1e6;
    assert!((47.5..=52.5).contains(&mbs), "{mbs}");
    let total = (cost[0] + cost[1]) / 2.0 / (now as f64 / 1e9);
    assert!(total >= 7_900.0, "{total}");
}
