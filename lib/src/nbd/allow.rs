//! Who may connect: an allow-list of IP networks, checked before negotiation.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::Error;

/// One network: an address and a prefix length (`10.1.0.0/16`, `::1/128`, `192.0.2.7`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Whether `peer` is in this network. An IPv4 peer seen as an IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`, as a dual-stack listener reports it) matches IPv4 networks.
    #[must_use]
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, peer) {
            (IpAddr::V4(n), IpAddr::V4(p)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(p) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(p)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(p) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Network {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::BadUrl {
            url: s.to_owned(),
            why: why.to_owned(),
        };
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim_matches(|c| c == '[' || c == ']')
            .parse()
            .map_err(|_| bad("not an IP address (expected ADDR or ADDR/PREFIX)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| bad(&format!("prefix must be 0 to {max}")))?,
        };
        Ok(Self { addr, prefix })
    }
}

/// The peers allowed to connect: empty allows everyone.
///
/// ```
/// use tagstripe::nbd::AllowList;
/// let allow: AllowList = "127.0.0.0/8,10.1.0.0/16,::1".parse()?;
/// assert!(allow.allows("10.1.200.3".parse().unwrap()));
/// assert!(allow.allows("::ffff:127.0.0.1".parse().unwrap()));
/// assert!(!allow.allows("10.2.0.1".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<AllowList>().is_err());
/// # Ok::<(), tagstripe::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    networks: Vec<Network>,
}

impl AllowList {
    /// Whether `peer` may connect.
    #[must_use]
    pub fn allows(&self, peer: IpAddr) -> bool {
        self.networks.is_empty() || self.networks.iter().any(|n| n.contains(peer))
    }

    /// Whether the list is empty (everyone may connect).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.networks.is_empty()
    }

    /// The networks.
    #[must_use]
    pub fn networks(&self) -> &[Network] {
        &self.networks
    }
}

impl FromStr for AllowList {
    type Err = Error;

    /// Comma-separated networks.
    fn from_str(s: &str) -> Result<Self, Error> {
        let networks = s
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(Network::from_str)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { networks })
    }
}
