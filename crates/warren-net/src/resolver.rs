//! The per-sandbox resolver: a small DNS server on the host end of the sandbox's link
//! (port 53, UDP and TCP). It answers only names the policy allows (its domains and the
//! hostnames of its services), from the node's static `hosts` or the upstream resolver,
//! and adds every address it hands out to the sandbox's allow set for the answer's TTL
//! before answering, so the connection that follows is let through. Any other name gets
//! NXDOMAIN; IPv6 questions get an empty answer (links are IPv4 only).

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record, RecordType};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;
use warren_types::network::domain_matches;

use crate::NetError;

/// How long an upstream question may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a TCP client may stay idle.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Shortest time an answer stays in the allow set (so a 0-TTL answer is still usable).
const MIN_TTL: u32 = 30;

/// Adds learnt addresses to the sandbox's allow set.
pub trait Learn: Send + Sync + 'static {
    fn learn(&self, addrs: &[Ipv4Addr], ttl: u32) -> Result<(), NetError>;
}

/// A name a policy allows.
#[derive(Debug, Clone, PartialEq)]
pub struct NameRule {
    /// A name or a wildcard (`*.example.test`).
    pub pattern: String,
    /// For a service's hostname: the service's networks. Answers inside them are already
    /// open on the service's ports and are not added; answers outside them are. Empty for a
    /// domain of the policy: its answers are opened (every port).
    pub covered: Vec<(Ipv4Addr, u8)>,
}

impl NameRule {
    fn covers(&self, a: Ipv4Addr) -> bool {
        self.covered.iter().any(|(net, len)| {
            let mask = if *len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(*len))
            };
            u32::from(a) & mask == u32::from(*net)
        })
    }
}

/// What a resolver may answer and where it finds answers.
pub struct Answers {
    /// Allowed names.
    pub allowed: RwLock<Vec<NameRule>>,
    pub hosts: std::collections::BTreeMap<String, Vec<Ipv4Addr>>,
    pub hosts_ttl: u32,
    pub upstream: Option<SocketAddr>,
    pub learn: Box<dyn Learn>,
}

impl Answers {
    /// The rules matching `name` (none: the name is not allowed).
    fn matching(&self, name: &str) -> Vec<NameRule> {
        self.allowed
            .read()
            .expect("resolver lock")
            .iter()
            .filter(|r| domain_matches(&r.pattern, name))
            .cloned()
            .collect()
    }

    /// The A records for an allowed name: static entries first, then upstream.
    async fn lookup(&self, q: &Query) -> Result<Vec<(Ipv4Addr, u32)>, ResponseCode> {
        let name = q.name.to_ascii().trim_end_matches('.').to_ascii_lowercase();
        if let Some(addrs) = self.hosts.get(&name) {
            return Ok(addrs.iter().map(|a| (*a, self.hosts_ttl)).collect());
        }
        let Some(up) = self.upstream else {
            return Err(ResponseCode::NXDomain);
        };
        let mut m = Message::query();
        m.metadata.id = rand_id();
        m.metadata.recursion_desired = true;
        m.add_query(q.clone());
        let bytes = m.to_vec().map_err(|_| ResponseCode::ServFail)?;
        let bind: SocketAddr = if up.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let sock = UdpSocket::bind(bind)
            .await
            .map_err(|_| ResponseCode::ServFail)?;
        sock.send_to(&bytes, up)
            .await
            .map_err(|_| ResponseCode::ServFail)?;
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(UPSTREAM_TIMEOUT, sock.recv(&mut buf))
            .await
            .map_err(|_| ResponseCode::ServFail)?
            .map_err(|_| ResponseCode::ServFail)?;
        let r = Message::from_vec(&buf[..n]).map_err(|_| ResponseCode::ServFail)?;
        if r.metadata.id != m.metadata.id {
            return Err(ResponseCode::ServFail);
        }
        if r.metadata.response_code != ResponseCode::NoError {
            return Err(r.metadata.response_code);
        }
        Ok(r.answers
            .iter()
            .filter_map(|rec| match &rec.data {
                RData::A(a) => Some((a.0, rec.ttl)),
                _ => None,
            })
            .collect())
    }

    /// Answers one DNS message; `None` for garbage (dropped).
    pub async fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let req = Message::from_vec(query).ok()?;
        if req.metadata.message_type != MessageType::Query {
            return None;
        }
        let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
        resp.metadata.recursion_desired = req.metadata.recursion_desired;
        resp.metadata.recursion_available = true;
        resp.add_queries(req.queries.iter().cloned());
        let code = match (req.metadata.op_code, req.queries.as_slice()) {
            (OpCode::Query, [q]) => self.answer_one(q, &mut resp).await,
            _ => ResponseCode::Refused,
        };
        resp.metadata.response_code = code;
        resp.to_vec().ok()
    }

    async fn answer_one(&self, q: &Query, resp: &mut Message) -> ResponseCode {
        let name = q.name.to_ascii().trim_end_matches('.').to_ascii_lowercase();
        let rules = self.matching(&name);
        if rules.is_empty() {
            return ResponseCode::NXDomain;
        }
        match q.query_type {
            RecordType::A => {}
            // Links are IPv4 only: an empty answer makes clients fall back to A.
            _ => return ResponseCode::NoError,
        }
        let found = match self.lookup(q).await {
            Ok(f) => f,
            Err(code) => return code,
        };
        if found.is_empty() {
            return ResponseCode::NoError;
        }
        let ttl = found.iter().map(|f| f.1).min().unwrap_or(MIN_TTL);
        // A domain of the policy opens what it resolves to; a service's hostname only what
        // lies outside the service's own (already open) networks.
        let addrs: Vec<Ipv4Addr> = found
            .iter()
            .map(|f| f.0)
            .filter(|a| !rules.iter().all(|r| r.covers(*a)))
            .collect();
        if addrs.is_empty() {
            // Nothing to open.
        } else if let Err(e) = self.learn.learn(&addrs, ttl.max(MIN_TTL)) {
            tracing::warn!(error = %e, name, "cannot open resolved addresses");
            return ResponseCode::ServFail;
        }
        for (a, ttl) in found {
            resp.add_answer(Record::from_rdata(q.name.clone(), ttl, RData::A(A(a))));
        }
        ResponseCode::NoError
    }
}

fn rand_id() -> u16 {
    let mut b = [0u8; 2];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        return t as u16;
    }
    u16::from_le_bytes(b)
}

/// A running resolver; dropping it stops it.
pub struct Resolver {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Resolver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Resolver {
    /// Serves `answers` on `addr`:53 (UDP and TCP).
    pub async fn start(addr: Ipv4Addr, answers: Arc<Answers>) -> Result<Resolver, NetError> {
        let sa = SocketAddr::from((addr, 53));
        let err = |e| NetError::Resolver {
            addr: sa.to_string(),
            source: e,
        };
        let udp = Arc::new(UdpSocket::bind(sa).await.map_err(err)?);
        let tcp = TcpListener::bind(sa).await.map_err(err)?;
        let a = answers.clone();
        let udp_task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                    continue;
                };
                let q = buf[..n].to_vec();
                let (a, udp) = (a.clone(), udp.clone());
                tokio::spawn(async move {
                    if let Some(r) = a.answer(&q).await {
                        let _ = udp.send_to(&r, from).await;
                    }
                });
            }
        });
        let tcp_task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = tcp.accept().await else {
                    continue;
                };
                let a = answers.clone();
                tokio::spawn(async move {
                    loop {
                        let mut len = [0u8; 2];
                        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut len)).await {
                            Ok(Ok(_)) => {}
                            _ => return,
                        }
                        let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                        if s.read_exact(&mut q).await.is_err() {
                            return;
                        }
                        let Some(r) = a.answer(&q).await else { return };
                        let mut out = (r.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(&r);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(Resolver {
            tasks: vec![udp_task, tcp_task],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::Name;
    use std::sync::Mutex;

    struct Rec(Mutex<Vec<(Ipv4Addr, u32)>>);
    impl Learn for Arc<Rec> {
        fn learn(&self, addrs: &[Ipv4Addr], ttl: u32) -> Result<(), NetError> {
            self.0
                .lock()
                .unwrap()
                .extend(addrs.iter().map(|a| (*a, ttl)));
            Ok(())
        }
    }

    fn ask(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    #[tokio::test]
    async fn answers_allowed_names_only_and_learns_their_addresses() {
        let rec = Arc::new(Rec(Mutex::new(Vec::new())));
        let mut hosts = std::collections::BTreeMap::new();
        hosts.insert(
            "a.mirror.test".to_string(),
            vec!["10.254.0.9".parse().unwrap()],
        );
        hosts.insert(
            "b.other.test".to_string(),
            vec!["10.254.0.10".parse().unwrap()],
        );
        hosts.insert(
            "svc.other.test".to_string(),
            vec!["10.254.0.11".parse().unwrap(), "10.9.0.1".parse().unwrap()],
        );
        let ans = Answers {
            allowed: RwLock::new(vec![
                NameRule {
                    pattern: "*.mirror.test".into(),
                    covered: vec![],
                },
                NameRule {
                    pattern: "svc.other.test".into(),
                    covered: vec![("10.254.0.0".parse().unwrap(), 24)],
                },
            ]),
            hosts,
            hosts_ttl: 60,
            upstream: None,
            learn: Box::new(rec.clone()),
        };
        let r = Message::from_vec(
            &ans.answer(&ask("A.Mirror.Test.", RecordType::A))
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert_eq!(r.metadata.id, 7);
        assert_eq!(r.answers.len(), 1);
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![("10.254.0.9".parse().unwrap(), 60)]
        );
        let r = Message::from_vec(
            &ans.answer(&ask("b.other.test.", RecordType::A))
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert!(r.answers.is_empty());
        let r = Message::from_vec(
            &ans.answer(&ask("a.mirror.test.", RecordType::AAAA))
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert!(r.answers.is_empty());
        // Allowed but unknown without an upstream: NXDOMAIN.
        let r = Message::from_vec(
            &ans.answer(&ask("c.mirror.test.", RecordType::A))
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(rec.0.lock().unwrap().len(), 1);
        assert!(ans.answer(b"garbage").await.is_none());
        // A service hostname: answered in full, but only the address outside the service's
        // networks is opened.
        let r = Message::from_vec(
            &ans.answer(&ask("svc.other.test.", RecordType::A))
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(r.answers.len(), 2);
        assert_eq!(
            rec.0.lock().unwrap().last().unwrap().0,
            "10.9.0.1".parse::<Ipv4Addr>().unwrap()
        );
        assert_eq!(rec.0.lock().unwrap().len(), 2);
    }
}
