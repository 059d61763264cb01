//! `serve --tenant NAME:KEY=VALUE[,KEY=VALUE...]`: the volume exported under NAME as a
//! tenant with a reservation, a weight and a limit; its figures at exit and on SIGUSR1.

use std::sync::Arc;

use tagstripe::scheduler::IoClass;
use tagstripe::{DynBlockDevice, TenantSpec, TenantStats, Tenants};

/// One `--tenant` option, parsed.
#[derive(Clone, Debug)]
pub(crate) struct TenantArg {
    /// The export's (and tenant's) name.
    pub(crate) name: String,
    /// Its spec.
    pub(crate) spec: TenantSpec,
    /// Its requests' class.
    pub(crate) class: IoClass,
}

const KEYS: &str = "weight, reserve-iops, reserve-mbs, limit-iops, limit-mbs, class";

/// Parses `NAME:KEY=VALUE[,KEY=VALUE...]` (every key optional: `NAME` alone is weight 100).
pub(crate) fn parse_tenant(s: &str) -> Result<TenantArg, String> {
    let (name, kvs) = s.split_once(':').unwrap_or((s, ""));
    if name.is_empty() {
        return Err(format!(
            "{s:?}: the tenant's name is empty (NAME:KEY=VALUE,...)"
        ));
    }
    let mut spec = TenantSpec::new();
    let mut class = IoClass::BestEffort;
    for kv in kvs.split(',').filter(|k| !k.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("tenant {name}: {kv:?} is not KEY=VALUE (keys: {KEYS})"))?;
        let num = |v: &str| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("tenant {name}: {k}={v:?} is not a non-negative number"))
        };
        match k {
            "weight" => {
                spec.weight = v
                    .parse()
                    .ok()
                    .filter(|w| (1..=10_000).contains(w))
                    .ok_or_else(|| format!("tenant {name}: weight={v:?} must be 1-10000"))?;
            }
            "reserve-iops" => spec.reserve_iops = num(v)?,
            "reserve-mbs" => spec.reserve_bps = num(v)? * 1e6,
            "limit-iops" => spec.limit_iops = num(v)?,
            "limit-mbs" => spec.limit_bps = num(v)? * 1e6,
            "class" => {
                class = IoClass::ALL
                    .into_iter()
                    .find(|c| c.name() == v)
                    .ok_or_else(|| {
                        format!(
                            "tenant {name}: class={v:?}: expected interactive, best-effort, bulk or idle"
                        )
                    })?;
            }
            _ => return Err(format!("tenant {name}: unknown key {k:?} (keys: {KEYS})")),
        }
    }
    spec.check().map_err(|e| {
        let e = e.to_string();
        format!(
            "tenant {name}: {}",
            e.replace("iops:", "reserve-iops/limit-iops:")
                .replace("bytes/s:", "reserve-mbs/limit-mbs:")
        )
    })?;
    Ok(TenantArg {
        name: name.to_owned(),
        spec,
        class,
    })
}

/// The tenants' scheduler over the served device.
pub(crate) type Shared = Tenants<Arc<dyn DynBlockDevice>>;
/// An export's name, its device (a tenant's handle) and its requests' class.
pub(crate) type TenantExport = (String, Arc<dyn DynBlockDevice>, Option<IoClass>);

/// The tenants over `device`: one per `--tenant`, and the plain export and each
/// `--class-export` as tenants of their own at weight 100 (so that every request goes
/// through the scheduler). Returns the scheduler and each export's (name, device, class).
pub(crate) fn build(
    device: &Arc<dyn DynBlockDevice>,
    tenants: &[TenantArg],
    plain: &[(String, Option<IoClass>)],
) -> Result<(Shared, Vec<TenantExport>), String> {
    let t = Tenants::new(Arc::clone(device));
    let mut out = Vec::new();
    for (name, class) in plain {
        let h = t.add(name, TenantSpec::new()).map_err(|e| e.to_string())?;
        out.push((name.clone(), Arc::new(h) as Arc<dyn DynBlockDevice>, *class));
    }
    for a in tenants {
        let h = t.add(&a.name, a.spec).map_err(|e| e.to_string())?;
        out.push((
            a.name.clone(),
            Arc::new(h) as Arc<dyn DynBlockDevice>,
            Some(a.class),
        ));
    }
    Ok((t, out))
}

/// Each tenant's figures since serving began, a line each.
pub(crate) fn report(t: &Shared, secs: f64) -> Vec<String> {
    let mut lines: Vec<String> = t.stats().iter().map(|s| line(s, secs)).collect();
    lines.push(format!(
        "tenants: {} requests at the device at most now (adaptive)",
        t.depth()
    ));
    lines
}

fn line(s: &TenantStats, secs: f64) -> String {
    let io = &s.io;
    let n = io.reads + io.writes;
    let bytes = io.bytes_read + io.bytes_written;
    let ms = |p: f64| {
        io.latency_percentile(p).map_or("-".to_owned(), |d| {
            format!("{:.2} ms", d.as_secs_f64() * 1e3)
        })
    };
    let owed = |r: f64, unit: &str, scale: f64| {
        if r > 0.0 {
            format!(" {} {unit}", r / scale)
        } else {
            String::new()
        }
    };
    let reserve = format!(
        "{}{}",
        owed(s.spec.reserve_iops, "IOPS", 1.0),
        owed(s.spec.reserve_bps, "MB/s", 1e6)
    );
    let limit = format!(
        "{}{}",
        owed(s.spec.limit_iops, "IOPS", 1.0),
        owed(s.spec.limit_bps, "MB/s", 1e6)
    );
    let iops = n as f64 / secs.max(1e-9);
    let met = if s.spec.reserve_iops > 0.0 {
        if iops >= 0.95 * s.spec.reserve_iops {
            ", reservation met"
        } else {
            ", reservation NOT met (or not asked for)"
        }
    } else {
        ""
    };
    format!(
        "tenant {}: weight {}, reserve{}, limit{}: {:.0} IOPS, {:.1} MB/s, p50 {}, p99 {}, \
         {} served to meet the reservation, held back by the limit {:.2} s{met}",
        s.name,
        s.spec.weight,
        if reserve.is_empty() {
            " -".into()
        } else {
            reserve
        },
        if limit.is_empty() { " -".into() } else { limit },
        iops,
        bytes as f64 / 1e6 / secs.max(1e-9),
        ms(50.0),
        ms(99.0),
        s.served.reserved,
        s.served.throttled as f64 / 1e9,
    )
}
