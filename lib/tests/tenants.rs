//! Tenants over the disk model (tokio's clock, paused: deterministic and fast): weights,
//! limits, reservations and work conservation measured through `Tenants` as a program
//! would use it, several requests in flight per tenant.

use std::sync::Arc;
use std::time::Duration;

use tagstripe::scheduler::{IoClass, Profile};
use tagstripe::{BlockDevice, IoOpts, SimDevice, Tenant, TenantSpec, Tenants};

const SECTORS: u64 = 1 << 22; // 2 GiB

/// `depth` tasks of 4 KiB random reads through `dev` until `secs` of virtual time have
/// passed; the reads completed.
async fn load<D: BlockDevice + 'static>(dev: Arc<D>, depth: u64, secs: u64, seed: u64) -> u64 {
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for w in 0..depth {
        let dev = Arc::clone(&dev);
        tasks.push(tokio::spawn(async move {
            let mut x = (seed * 7919 + w + 1) | 1;
            let mut n = 0u64;
            let mut buf = vec![0u8; 4096];
            while tokio::time::Instant::now() < end {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = x % (SECTORS / 8) * 8;
                dev.read_into(at, &mut buf, IoOpts::new().class(IoClass::BestEffort))
                    .await
                    .unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

fn ssd() -> SimDevice {
    SimDevice::with_profile("ssd", Profile::Ssd, SECTORS).unwrap()
}

fn pair(
    a: TenantSpec,
    b: TenantSpec,
) -> (
    Tenants<SimDevice>,
    Arc<Tenant<SimDevice>>,
    Arc<Tenant<SimDevice>>,
) {
    let t = Tenants::new(ssd());
    let x = Arc::new(t.add("a", a).unwrap());
    let y = Arc::new(t.add("b", b).unwrap());
    (t, x, y)
}

#[tokio::test(start_paused = true)]
async fn weights_split_a_saturated_device() {
    let (t, a, b) = pair(TenantSpec::new().weight(300), TenantSpec::new().weight(100));
    let (x, y) = tokio::join!(load(a, 32, 4, 1), load(b, 32, 4, 2));
    let ratio = x as f64 / y as f64;
    assert!(
        (2.7..=3.3).contains(&ratio),
        "{x} and {y}: {ratio:.2} (depth {})",
        t.depth()
    );
    assert!(t.depth() >= 2);
}

#[tokio::test(start_paused = true)]
async fn a_limit_holds_alone_and_beside_a_saturating_tenant() {
    for neighbour in [false, true] {
        let (t, a, b) = pair(TenantSpec::new().limit_iops(2_000.0), TenantSpec::new());
        let (x, _) = tokio::join!(load(a, 16, 4, 3), async {
            if neighbour {
                load(b, 16, 4, 4).await
            } else {
                0
            }
        });
        let iops = x as f64 / 4.0;
        assert!(
            (1_900.0..=2_100.0).contains(&iops),
            "neighbour {neighbour}: {iops} IOPS for a limit of 2000"
        );
        assert!(t.stats()[0].served.throttled > 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_reservation_holds_beside_a_heavy_tenant() {
    let (t, a, b) = pair(
        TenantSpec::new().weight(1).reserve_iops(5_000.0),
        TenantSpec::new().weight(1_000),
    );
    let (x, y) = tokio::join!(load(a, 16, 4, 5), load(b, 16, 4, 6));
    let iops = x as f64 / 4.0;
    assert!(
        iops >= 4_750.0,
        "{iops} IOPS reserved 5000 (the other got {})",
        y / 4
    );
    let s = &t.stats()[0];
    assert!(s.served.reserved > 0 && s.io.reads == x);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_alone_gets_what_the_device_gives() {
    let plain = load(Arc::new(ssd()), 16, 4, 7).await;
    let t = Tenants::new(ssd());
    let only = Arc::new(t.add("only", TenantSpec::new()).unwrap());
    let tenanted = load(only, 16, 4, 7).await;
    let ratio = tenanted as f64 / plain as f64;
    assert!(
        ratio >= 0.9,
        "{tenanted} against {plain} untenanted: {ratio:.2}"
    );
}

#[tokio::test(start_paused = true)]
async fn names_and_specs_are_checked() {
    let t = Tenants::new(ssd());
    t.add("a", TenantSpec::new()).unwrap();
    let e = t.add("a", TenantSpec::new()).unwrap_err().to_string();
    assert!(e.contains("exists already"), "{e}");
    let e = t
        .add("b", TenantSpec::new().weight(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tenant b") && e.contains("weight 0"), "{e}");
    let e = t.set("zz", TenantSpec::new()).unwrap_err().to_string();
    assert!(e.contains("no such tenant"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn requests_cancelled_while_waiting_or_at_the_device_give_their_slots_back() {
    let t = Tenants::new(ssd());
    let a = Arc::new(t.add("a", TenantSpec::new().limit_iops(1_000.0)).unwrap());
    // Many requests, most cancelled while they wait (the limit holds them), some at the device.
    for round in 0..20u64 {
        let mut set = Vec::new();
        for i in 0..64u64 {
            let a = Arc::clone(&a);
            set.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = tokio::time::timeout(
                    Duration::from_micros(50 + (round * 64 + i) % 900),
                    a.read_into(((round * 64 + i) % 1000) * 8, &mut buf, IoOpts::new()),
                )
                .await;
            }));
        }
        for h in set {
            h.await.unwrap();
        }
    }
    // Every slot came back: a full load still runs at the limit.
    let n = load(Arc::clone(&a), 16, 2, 9).await;
    assert!(
        n as f64 / 2.0 >= 900.0,
        "{n} reads in 2 s at a limit of 1000/s"
    );
}

/// Each tenant's figures: reads, writes and bytes counted to the tenant that sent them,
/// failures as errors, latency from submission (the wait for a limit included), nothing
/// left in flight after, and a request given up while it waited not counted at all.
#[tokio::test(start_paused = true)]
async fn each_tenant_counts_its_own_requests_and_failures() {
    use bytes::Bytes;
    use tagstripe::{Fault, FaultDevice, FaultKind, FaultOp, MemDevice};
    let dev = FaultDevice::new(MemDevice::new("mem", 1 << 16));
    // Writes at sector 1000 and beyond fail.
    dev.inject(Fault {
        sectors: Some((1000, 1 << 16)),
        ..Fault::always(FaultOp::Write, FaultKind::Error)
    });
    let t = Tenants::new(dev);
    let a = t.add("a", TenantSpec::new()).unwrap();
    let b = t.add("b", TenantSpec::new().limit_iops(100.0)).unwrap();
    for i in 0..10u64 {
        a.write(i * 8, Bytes::from(vec![1u8; 4096]), IoOpts::new())
            .await
            .unwrap();
    }
    assert!(
        a.write(1000, Bytes::from(vec![1u8; 512]), IoOpts::new())
            .await
            .is_err()
    );
    // b's ten reads at 100 a second: the last waits about 90 ms for its limit.
    for i in 0..10u64 {
        b.read(i * 8, 16, IoOpts::new()).await.unwrap();
    }
    // One of b's given up while its limit holds it.
    let gave_up = tokio::time::timeout(Duration::from_micros(10), b.read(0, 8, IoOpts::new()));
    assert!(gave_up.await.is_err(), "the limit held it");
    let s = t.stats();
    let (sa, sb) = (&s[0], &s[1]);
    assert_eq!((sa.name.as_str(), sb.name.as_str()), ("a", "b"));
    assert_eq!(
        (sa.io.writes, sa.io.bytes_written, sa.io.errors, sa.io.reads),
        (10, 40960, 1, 0)
    );
    assert_eq!(
        (sb.io.reads, sb.io.bytes_read, sb.io.errors, sb.io.writes),
        (10, 81920, 0, 0)
    );
    assert_eq!((sa.io.in_flight, sb.io.in_flight), (0, 0));
    // A's writes did not wait (memory, no limit); b's slowest waited for its limit.
    let p99 = |io: &tagstripe::StatsSnapshot| io.latency_percentile(99.0).unwrap();
    assert!(p99(&sa.io) < Duration::from_millis(1), "{:?}", sa.io);
    assert!(p99(&sb.io) >= Duration::from_millis(5), "{:?}", sb.io);
}

/// A device whose writes wait until the test opens the gate; reads are served at once.
#[derive(Debug)]
struct Gate {
    info: tagstripe::DeviceInfo,
    open: tokio::sync::watch::Receiver<bool>,
}

impl BlockDevice for Gate {
    fn info(&self) -> &tagstripe::DeviceInfo {
        &self.info
    }
    async fn read(
        &self,
        _start: u64,
        sectors: u64,
        _opts: IoOpts,
    ) -> tagstripe::Result<bytes::Bytes> {
        Ok(bytes::Bytes::from(vec![0u8; sectors as usize * 512]))
    }
    async fn write(
        &self,
        _start: u64,
        _data: bytes::Bytes,
        _opts: IoOpts,
    ) -> tagstripe::Result<()> {
        let mut open = self.open.clone();
        // The sender lives as long as the test: an error would be a bug in the test.
        open.wait_for(|&o| o).await.expect("gate sender alive");
        Ok(())
    }
    async fn flush(&self, _opts: IoOpts) -> tagstripe::Result<()> {
        Ok(())
    }
    async fn discard(&self, _start: u64, _sectors: u64, _opts: IoOpts) -> tagstripe::Result<()> {
        Ok(())
    }
}

/// With the depth full of a bulk tenant's writes that do not finish, another tenant's
/// interactive read still goes to the device (a fair queue below serves it first), while
/// its best-effort read waits for a slot as the depth says; once the writes finish,
/// everything completes.
#[tokio::test(start_paused = true)]
async fn an_interactive_read_goes_past_a_depth_full_of_bulk_writes() {
    let (tx, open) = tokio::sync::watch::channel(false);
    let t = Tenants::new(Gate {
        info: tagstripe::DeviceInfo::new("gate", SECTORS),
        open,
    });
    let vm = Arc::new(t.add("vm", TenantSpec::new()).unwrap());
    let backup = Arc::new(t.add("backup", TenantSpec::new()).unwrap());
    // The vm is busy (it read a moment ago), so the two share and the depth applies.
    vm.read(0, 8, IoOpts::new().class(IoClass::Interactive))
        .await
        .unwrap();
    let writes: Vec<_> = (0..32u64)
        .map(|i| {
            let b = Arc::clone(&backup);
            tokio::spawn(async move {
                b.write(
                    i * 2048,
                    bytes::Bytes::from(vec![7u8; 1 << 20]),
                    IoOpts::new().class(IoClass::Bulk),
                )
                .await
            })
        })
        .collect();
    tokio::task::yield_now().await;
    let depth = t.depth();
    assert!(depth < 32, "the depth ({depth}) holds some writes back");
    let read = vm.read(8, 8, IoOpts::new().class(IoClass::Interactive));
    let got = tokio::time::timeout(Duration::from_secs(1), read).await;
    assert!(
        matches!(got, Ok(Ok(_))),
        "the interactive read was held: {got:?}"
    );
    let best_effort = vm.read(16, 8, IoOpts::new().class(IoClass::BestEffort));
    assert!(
        tokio::time::timeout(Duration::from_secs(1), best_effort)
            .await
            .is_err(),
        "a best-effort read waits for a slot while the depth is full"
    );
    tx.send(true).unwrap();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    vm.read(16, 8, IoOpts::new().class(IoClass::BestEffort))
        .await
        .unwrap();
}

/// A tenant busy alone, owed nothing and held to nothing, goes past the scheduler; a limit
/// set while it runs holds from its next requests, and what it was served is counted either
/// way.
#[tokio::test(start_paused = true)]
async fn a_limit_set_while_a_tenant_runs_alone_holds_at_once() {
    let t = Tenants::new(ssd());
    let a = Arc::new(t.add("a", TenantSpec::new()).unwrap());
    let free = load(Arc::clone(&a), 16, 1, 11).await;
    assert!(free > 10_000, "{free} reads in 1 s alone");
    t.set("a", TenantSpec::new().limit_iops(2_000.0)).unwrap();
    let held = load(Arc::clone(&a), 16, 4, 12).await;
    let iops = held as f64 / 4.0;
    assert!(
        (1_900.0..=2_100.0).contains(&iops),
        "{iops} IOPS for a limit of 2000 set at run time"
    );
    let s = &t.stats()[0];
    assert_eq!(s.io.reads, free + held);
    assert_eq!(s.served.served, free + held, "{:?}", s.served);
    assert_eq!(s.served.bytes, (free + held) * 4096);
    assert!(s.served.throttled > 0);
    assert_eq!(s.io.in_flight, 0);
}

/// A memory device of 4 tags that gives the runtime a turn before each request: requests
/// end on whichever worker picks them up again.
#[derive(Debug)]
struct Yielding(tagstripe::MemDevice, tagstripe::DeviceInfo);

impl Yielding {
    fn new() -> Self {
        let mem = tagstripe::MemDevice::new("mem", 1 << 16);
        let mut info = mem.info().clone();
        info.limits.max_tags = 4;
        Self(mem, info)
    }
}

impl BlockDevice for Yielding {
    fn info(&self) -> &tagstripe::DeviceInfo {
        &self.1
    }
    async fn read(
        &self,
        start: u64,
        sectors: u64,
        opts: IoOpts,
    ) -> tagstripe::Result<bytes::Bytes> {
        tokio::task::yield_now().await;
        self.0.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: bytes::Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        tokio::task::yield_now().await;
        self.0.write(start, data, opts).await
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.0.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.0.discard(start, sectors, opts).await
    }
}

/// On two workers, a tenant alone (past the scheduler) is joined by a second one and left
/// again, over and over, with more requests than the device's 4 tags: every request
/// completes (no slot lost at a hand-over between the path without the lock and the
/// scheduler's), each tenant's counts add up, and nothing is left in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_joining_and_leaving_lose_no_request_on_two_workers() {
    let t = Tenants::new(Yielding::new());
    let a = Arc::new(t.add("a", TenantSpec::new()).unwrap());
    // b is owed a reservation: alone, it still goes through the scheduler and the tags.
    let b = Arc::new(
        t.add("b", TenantSpec::new().weight(300).reserve_iops(1.0))
            .unwrap(),
    );
    let run = |dev: Arc<Tenant<Yielding>>, tasks: u64, each: u64| async move {
        let mut set = Vec::new();
        for w in 0..tasks {
            let dev = Arc::clone(&dev);
            set.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                for i in 0..each {
                    let at = (w * 97 + i * 13) % 8000 * 8;
                    dev.read_into(at, &mut buf, IoOpts::new()).await.unwrap();
                }
            }));
        }
        for h in set {
            h.await.unwrap();
        }
    };
    let mut want_a = 0;
    let mut want_b = 0;
    for round in 0..20u64 {
        // a alone, then a and b together.
        let alone = tokio::time::timeout(Duration::from_secs(60), run(Arc::clone(&a), 16, 200));
        assert!(
            alone.await.is_ok(),
            "round {round}: a request of a alone never completed"
        );
        want_a += 16 * 200;
        let each = 50 + round * 10;
        let done = tokio::time::timeout(
            Duration::from_secs(60),
            futures_join(run(Arc::clone(&a), 16, each), run(Arc::clone(&b), 8, each)),
        )
        .await;
        assert!(done.is_ok(), "round {round}: a request never completed");
        want_a += 16 * each;
        want_b += 8 * each;
    }
    let s = t.stats();
    assert_eq!((s[0].io.reads, s[1].io.reads), (want_a, want_b));
    assert_eq!((s[0].served.served, s[1].served.served), (want_a, want_b));
    assert_eq!((s[0].io.in_flight, s[1].io.in_flight), (0, 0));
    // A tenant alone that is owed a reservation goes through the scheduler: 16 requests
    // on 4 tags, the rest waiting, each completion handing its slot on.
    let t = Tenants::new(Yielding::new());
    let c = Arc::new(t.add("c", TenantSpec::new().reserve_iops(1.0)).unwrap());
    let alone = tokio::time::timeout(Duration::from_secs(60), run(Arc::clone(&c), 16, 500));
    assert!(alone.await.is_ok(), "a request of c alone never completed");
    let s = &t.stats()[0];
    assert_eq!(
        (s.io.reads, s.served.served, s.io.in_flight),
        (8000, 8000, 0)
    );
}

/// Both futures, to completion.
async fn futures_join(x: impl Future<Output = ()>, y: impl Future<Output = ()>) {
    tokio::join!(x, y);
}
