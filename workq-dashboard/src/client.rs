//! Who a client is, for the limits kept per client: the connection caps of
//! [`Server`](crate::Server) and the slowing down of failed token attempts.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The key a client's limits are counted under: an IPv4 address as it is (an IPv4-mapped
/// IPv6 address as its IPv4 address), an IPv6 address by its /64, since one machine (one
/// home or cloud network, often) is given a whole /64 and may send from any address in it.
pub(crate) fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// The key of clients whose address is not known, or not kept.
pub(crate) const UNKNOWN_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        let a: IpAddr = "2001:db8:1:2::7".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::7".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(other));
        let v4: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(client_key(v4), v4);
        let mapped: IpAddr = "::ffff:203.0.113.9".parse().unwrap();
        assert_eq!(client_key(mapped), v4);
        assert_ne!(
            client_key("203.0.113.10".parse().unwrap()),
            client_key(v4),
            "IPv4 addresses are clients of their own"
        );
    }
}
