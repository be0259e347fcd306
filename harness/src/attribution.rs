//! Attributes a provider request to the process that sent it, with no help from the stack.
//!
//! The fake providers tell the harness about every TCP connection they accept before serving its
//! first byte (`Hook::on_connect`): the client is then waiting for our greeting or response, so it
//! still holds its socket. [`Attributor::connected`] finds that socket's inode and the candidate
//! process holding a descriptor on it (`/proc/<pid>/fd/*`), and remembers peer → pid for the
//! connection's life; [`Attributor::sender`] answers from that table at once when the
//! connection's ledger entries arrive, however soon the connection closes afterwards. Only the
//! stack's own processes (the candidates, then their process groups) are searched.
//!
//! Finding the inode (measured on the 2-core development machine, release build, loopback, with
//! `measure_single_lookups` below): an exact `NETLINK_SOCK_DIAG` lookup by 4-tuple (source = the
//! peer, destination = a provider's listening address, [`Attributor::add_server`]) takes 3 µs
//! (2 µs for a miss; 9–15 µs while the host is busy), where reading `/proc/net/tcp` takes 4.7 ms
//! with 16 sockets on the host and 20 ms with ~7,000: the kernel walks its whole socket hash table
//! for every read. The inode → pid step reads the candidates' descriptor links, newest process
//! first, and caches the answer per inode: netlink plus that scan of a process with 11 descriptors
//! took 24 µs in all. During the e2e scenario of `tests/run_e2e.rs` (workers with ~40
//! descriptors, the 2 cores saturated by PostgreSQL and the stack), a whole
//! [`Attributor::connected`] took 0.2 ms at the median, 2.3 ms at p90 and 24 ms at p99 (the CPU
//! is contended; p99 includes the second look below), so with netlink it runs inline on the
//! connection's task; the `/proc/net/tcp` fallback runs on tokio's blocking pool.
//!
//! A socket no candidate holds is looked for in the candidates' process groups: the harness starts
//! each stack process as a group leader and signals the whole group, so a send by a member (the
//! children of a prefork worker, as Celery or Resque run them) is its leader's, the candidate's.
//!
//! What cannot be attributed: a sender that dies (SIGKILL) or closes its socket between its
//! `connect` and the lookup, i.e. while its connection waits in the provider's accept queue,
//! leaves no process holding the socket. HTTP still delivers the request it had written, so the
//! provider records a send nobody can be named for; [`Found::Closed`] tells the caller so.
//!
//! Fallbacks: without netlink (socket refused at start, or a lookup error) or without known server
//! addresses, a single lookup reads `/proc/net/tcp*`. A send whose connection was not resolved at
//! connect time (the hook timed out, or the connection predates the hook) is queued by the caller
//! and resolved in batches by [`Attributor::resolve_many`], with one read of the socket tables for
//! the whole batch; that can only succeed while the connection is still open.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use netlink_packet_sock_diag::SockDiagMessage;

/// What a lookup found for a peer address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The candidate process that holds the peer's socket.
    Sender(u32),
    /// No open socket has that address: the client closed it, or died, before the lookup. At
    /// connect time that means its sender hung up or was killed between its `connect` and the
    /// provider's accept; no later lookup can name it either.
    Closed,
    /// The socket is open but no candidate holds it (yet), or the lookup failed.
    Unknown,
}

/// How long [`Attributor::connected`] waits before looking again at a socket no candidate holds.
const SECOND_LOOK: std::time::Duration = std::time::Duration::from_millis(10);

/// Maps peer socket addresses to the pids of candidate processes.
#[derive(Clone)]
pub struct Attributor {
    candidates: Arc<RwLock<Vec<u32>>>,
    /// Where the fake providers listen: the destination of every socket we look up.
    servers: Arc<RwLock<Vec<SocketAddr>>>,
    /// socket inode → pid; an inode is never reused while its socket is open.
    cache: Arc<Mutex<HashMap<u64, u32>>>,
    /// peer → what the lookup found when the connection was accepted (`Sender` or `Closed`). A
    /// new connection from the same address (a reused port) replaces the entry.
    connections: Arc<Mutex<HashMap<SocketAddr, Found>>>,
    /// `None` when the kernel refused a `NETLINK_SOCK_DIAG` socket: `/proc/net/tcp*` only.
    diag: Arc<Mutex<Option<SockDiag>>>,
}

impl Default for Attributor {
    fn default() -> Self {
        Attributor::new()
    }
}

impl Attributor {
    /// An attributor with no candidates yet; opens its `NETLINK_SOCK_DIAG` socket (or logs why it
    /// falls back to `/proc/net/tcp*`).
    pub fn new() -> Attributor {
        let diag = match SockDiag::open() {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "NETLINK_SOCK_DIAG unavailable; finding senders' sockets through /proc/net/tcp"
                );
                None
            }
        };
        Attributor {
            candidates: Arc::default(),
            servers: Arc::default(),
            cache: Arc::default(),
            connections: Arc::default(),
            diag: Arc::new(Mutex::new(diag)),
        }
    }

    /// Adds a process whose sockets may carry provider requests.
    pub fn add_candidate(&self, pid: u32) {
        self.candidates
            .write()
            .expect("attributor poisoned")
            .push(pid);
    }

    /// Adds an address a fake provider listens on: single lookups ask the kernel for the socket
    /// from the peer to one of these.
    pub fn add_server(&self, addr: SocketAddr) {
        self.servers
            .write()
            .expect("attributor poisoned")
            .push(addr);
    }

    /// Resolves the sender of a connection a fake provider just accepted from `peer` (call it
    /// before the connection is served, while the client holds its socket) and remembers the
    /// answer for [`Attributor::connection`] unless it is [`Found::Unknown`]. Whatever was
    /// remembered for `peer` before is forgotten first: it belonged to an earlier connection.
    pub async fn connected(&self, peer: SocketAddr) -> Found {
        self.connections
            .lock()
            .expect("attributor poisoned")
            .remove(&peer);
        let mut found = self.find_async(peer).await;
        if found == Found::Unknown {
            // A dying owner loses its descriptors a moment before its sockets close, and a
            // process just started may not be a candidate yet: look once more, shortly after.
            tokio::time::sleep(SECOND_LOOK).await;
            found = self.find_async(peer).await;
        }
        if found != Found::Unknown {
            self.connections
                .lock()
                .expect("attributor poisoned")
                .insert(peer, found);
        }
        found
    }

    /// [`Attributor::find`] from an async task: inline when lookups go through netlink (tens of
    /// microseconds: one request, then a few dozen descriptor links read per candidate), on
    /// tokio's blocking pool when they read `/proc/net/tcp*` (milliseconds). Inline also keeps
    /// the time between the accept and the lookup, when a dying sender is lost, short.
    async fn find_async(&self, peer: SocketAddr) -> Found {
        if self.lookups_are_cheap() {
            return self.find(peer);
        }
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.find(peer)).await {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(%peer, error = %e, "sender lookup failed");
                Found::Unknown
            }
        }
    }

    /// Whether a single lookup goes through netlink rather than `/proc/net/tcp*`.
    fn lookups_are_cheap(&self) -> bool {
        !self.servers.read().expect("attributor poisoned").is_empty()
            && self.diag.lock().expect("attributor poisoned").is_some()
    }

    /// What [`Attributor::connected`] found for the connection from `peer`, if it remembered
    /// anything. Never touches `/proc`: safe on a provider's request path.
    pub fn connection(&self, peer: SocketAddr) -> Option<Found> {
        self.connections
            .lock()
            .expect("attributor poisoned")
            .get(&peer)
            .copied()
    }

    /// The sender of the connection from `peer`, as [`Attributor::connected`] found it.
    pub fn sender(&self, peer: SocketAddr) -> Option<u32> {
        match self.connection(peer) {
            Some(Found::Sender(pid)) => Some(pid),
            _ => None,
        }
    }

    /// The pid owning the socket whose local address is `peer`, if it is still open and owned by a
    /// candidate process.
    pub fn resolve(&self, peer: SocketAddr) -> Option<u32> {
        match self.find(peer) {
            Found::Sender(pid) => Some(pid),
            Found::Closed | Found::Unknown => None,
        }
    }

    /// Looks up the socket whose local address is `peer`, then the candidate holding it.
    fn find(&self, peer: SocketAddr) -> Found {
        let Some(inode) = self.inode_of(peer) else {
            return Found::Closed;
        };
        if let Some(pid) = self.cache.lock().expect("attributor poisoned").get(&inode) {
            return Found::Sender(*pid);
        }
        let candidates = self.candidates.read().expect("attributor poisoned").clone();
        // The candidates themselves first (newest first), then, only when none holds it, the
        // other members of their process groups.
        let own = candidates.iter().rev().map(|pid| (*pid, *pid));
        let found = holder_of(inode, own).or_else(|| holder_of(inode, group_members(&candidates)));
        if let Some(pid) = found {
            self.cache
                .lock()
                .expect("attributor poisoned")
                .insert(inode, pid);
            return Found::Sender(pid);
        }
        // Its owner may have closed it, or died, while we searched.
        match self.inode_of(peer) {
            Some(now) if now == inode => Found::Unknown,
            _ => Found::Closed,
        }
    }

    /// The inode of the open TCP socket whose local address is `peer`: through netlink when the
    /// servers are known (they must be every address the fakes listen on), else (or when netlink
    /// fails) from `/proc/net/tcp*`.
    fn inode_of(&self, peer: SocketAddr) -> Option<u64> {
        let servers = self.servers.read().expect("attributor poisoned").clone();
        if !servers.is_empty() {
            if let Some(diag) = self.diag.lock().expect("attributor poisoned").as_mut() {
                match diag.find(peer, &servers) {
                    Ok(inode) => return inode,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "sock_diag lookup failed; reading /proc/net/tcp")
                    }
                }
            }
        }
        socket_inode(peer)
    }
}

impl Attributor {
    /// Resolves many peers with one read of the socket tables and one scan of the candidates'
    /// descriptors.
    pub fn resolve_many(&self, peers: &[SocketAddr]) -> Vec<Option<u32>> {
        if peers.is_empty() {
            return Vec::new();
        }
        let mut tables = String::new();
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(t) = std::fs::read_to_string(f) {
                tables.push_str(&t);
            }
        }
        let mut by_local: HashMap<&str, u64> = HashMap::new();
        for line in tables.lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if let (Some(local), Some(inode)) =
                (cols.get(1), cols.get(9).and_then(|i| i.parse::<u64>().ok()))
            {
                if inode != 0 {
                    by_local.insert(local, inode);
                }
            }
        }
        let inodes: Vec<Option<u64>> = peers
            .iter()
            .map(|p| by_local.get(local_hex(*p).as_str()).copied())
            .collect();
        let mut owner: HashMap<u64, u32> = self.cache.lock().expect("attributor poisoned").clone();
        let missing =
            |owner: &HashMap<u64, u32>| inodes.iter().flatten().any(|i| !owner.contains_key(i));
        if missing(&owner) {
            let candidates = self.candidates.read().expect("attributor poisoned").clone();
            for pid in &candidates {
                for inode in sockets_of(*pid) {
                    owner.insert(inode, *pid);
                }
            }
            if missing(&owner) {
                for (member, leader) in group_members(&candidates) {
                    for inode in sockets_of(member) {
                        owner.entry(inode).or_insert(leader);
                    }
                }
            }
            let mut cache = self.cache.lock().expect("attributor poisoned");
            for i in inodes.iter().flatten() {
                if let Some(pid) = owner.get(i) {
                    cache.insert(*i, *pid);
                }
            }
        }
        inodes
            .into_iter()
            .map(|i| i.and_then(|i| owner.get(&i).copied()))
            .collect()
    }
}

/// Exact TCP socket lookups through `NETLINK_SOCK_DIAG` (`inet_diag_req_v2` without
/// `NLM_F_DUMP`): the kernel finds the socket by its 4-tuple in its hash tables, so the cost does
/// not grow with the number of sockets on the host.
struct SockDiag {
    socket: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl SockDiag {
    fn open() -> io::Result<SockDiag> {
        let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        // The kernel answers a sock_diag request before `send` returns; never wait for more.
        socket.set_non_blocking(true)?;
        Ok(SockDiag {
            socket,
            seq: 0,
            buf: vec![0; 8192],
        })
    }

    /// The inode of the socket from `src` to any of `dsts` (same address family), `None` when
    /// there is none (closed, or never connected to them).
    fn find(&mut self, src: SocketAddr, dsts: &[SocketAddr]) -> io::Result<Option<u64>> {
        for dst in dsts.iter().filter(|d| d.is_ipv4() == src.is_ipv4()) {
            if let Some(inode) = self.exact(src, *dst)? {
                return Ok(Some(inode));
            }
        }
        Ok(None)
    }

    /// One exact lookup of the TCP socket `src` → `dst`.
    fn exact(&mut self, src: SocketAddr, dst: SocketAddr) -> io::Result<Option<u64>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = self.seq;
        let mut id = if src.is_ipv4() {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        id.source_address = src.ip();
        id.source_port = src.port();
        id.destination_address = dst.ip();
        id.destination_port = dst.port();
        // INET_DIAG_NOCOOKIE: match by addresses and ports alone.
        id.cookie = [0xff; 8];
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family: if src.is_ipv4() { AF_INET } else { AF_INET6 },
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::all(),
                socket_id: id,
            })
            .into(),
        );
        request.finalize();
        let mut bytes = vec![0; request.buffer_len()];
        request.serialize(&mut bytes);
        self.socket.send(&bytes, 0)?;
        loop {
            let n = self.socket.recv(&mut &mut self.buf[..], 0)?;
            let reply = NetlinkMessage::<SockDiagMessage>::deserialize(&self.buf[..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if reply.header.sequence_number != self.seq {
                continue; // an answer to an earlier request nobody waited for
            }
            return match reply.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                    Ok(Some(u64::from(r.header.inode)).filter(|i| *i != 0))
                }
                NetlinkPayload::Error(e) if e.raw_code() == -libc::ENOENT => Ok(None),
                NetlinkPayload::Error(e) => Err(e.to_io()),
                other => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unexpected sock_diag answer: {other:?}"),
                )),
            };
        }
    }
}

/// The `/proc/net/tcp*` spelling of a local address.
fn local_hex(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => {
            let o = ip.octets();
            format!(
                "{:02X}{:02X}{:02X}{:02X}:{:04X}",
                o[3],
                o[2],
                o[1],
                o[0],
                addr.port()
            )
        }
        IpAddr::V6(ip) => {
            let mut hex = String::new();
            for chunk in ip.octets().chunks(4) {
                for b in chunk.iter().rev() {
                    hex.push_str(&format!("{b:02X}"));
                }
            }
            format!("{hex}:{:04X}", addr.port())
        }
    }
}

/// The inode of the TCP socket whose local address is `addr`.
///
/// The kernel writes the table a page at a time and resumes each read by position in its hash
/// chains, so a read racing other sockets' opening and closing can skip a line: a miss is read
/// again, up to [`TABLE_READS`] times, before the socket counts as closed.
fn socket_inode(addr: SocketAddr) -> Option<u64> {
    let file = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let local = local_hex(addr);
    (0..TABLE_READS).find_map(|_| {
        let text = std::fs::read_to_string(file).ok()?;
        text.lines().skip(1).find_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            (cols.get(1) == Some(&local.as_str()))
                .then(|| cols.get(9)?.parse::<u64>().ok())
                .flatten()
                .filter(|inode| *inode != 0)
        })
    })
}

/// The first of `holders` (each a process to search and the candidate it counts for) that has a
/// descriptor on the socket `inode`: the candidate.
fn holder_of(inode: u64, holders: impl IntoIterator<Item = (u32, u32)>) -> Option<u32> {
    let want = format!("socket:[{inode}]");
    holders.into_iter().find_map(|(pid, leader)| {
        let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        dir.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
            .then_some(leader)
    })
}

/// The socket inodes `pid` holds descriptors on.
fn sockets_of(pid: u32) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|fd| {
            let link = std::fs::read_link(fd.path()).ok()?;
            link.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The processes other than the candidates in a candidate's process group, each with that
/// candidate. The harness starts every stack process as the leader of a group of its own and
/// signals the whole group, so a send by a member (a prefork worker's child, the child of a
/// wrapper that did not `exec`) is the candidate's: its chaos reaches the member too. A member
/// that left the group (`setsid`, `setpgid`) is not found.
fn group_members(candidates: &[u32]) -> Vec<(u32, u32)> {
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    proc.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !candidates.contains(pid))
        .filter_map(|pid| {
            let group = process_group(pid)?;
            candidates.contains(&group).then_some((pid, group))
        })
        .collect()
}

/// The process group of `pid`, from `/proc/<pid>/stat` (`pid (comm) state ppid pgrp …`; the
/// command name may hold spaces and parentheses, so the fields are read after its last `)`).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat.rsplit_once(')')?;
    fields.split_whitespace().nth(2)?.parse().ok()
}

/// Reads of `/proc/net/tcp*` before a socket not found in them counts as closed.
const TABLE_READS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener, a client connected to it, the accepted end, and the client's address as the
    /// server sees it.
    fn pair() -> (
        std::net::TcpListener,
        std::net::TcpStream,
        std::net::TcpStream,
        SocketAddr,
    ) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        (listener, client, accepted, peer)
    }

    #[test]
    fn resolves_own_socket_to_own_pid() {
        let (listener, _client, _accepted, peer) = pair();
        let me = std::process::id();
        let a = Attributor::new();
        assert_eq!(a.resolve(peer), None, "not a candidate yet");
        a.add_candidate(me);
        assert_eq!(a.resolve(peer), Some(me), "through /proc/net/tcp");
        a.cache.lock().unwrap().clear();
        a.add_server(listener.local_addr().unwrap());
        assert_eq!(a.resolve(peer), Some(me), "through netlink");
        let unknown: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(a.resolve(unknown), None);
        assert_eq!(a.resolve_many(&[unknown, peer]), vec![None, Some(me)]);
    }

    /// A process started as a group leader (as the harness starts the stack's) whose child, not
    /// itself, connects: the send is the leader's, through netlink and through the batch
    /// fallback; a process of another group is never named for it.
    #[test]
    fn a_socket_held_by_a_member_of_a_candidates_group_is_the_candidates() {
        use std::os::unix::process::CommandExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // `; true` keeps sh from exec'ing bash: bash is its child, in its group.
        let script = format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}; sleep 30'; true");
        let mut leader = std::process::Command::new("sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        let pid = leader.id();
        let a = Attributor::new();
        a.add_candidate(std::process::id());
        assert_eq!(a.resolve(peer), None, "its group has no candidate yet");
        a.add_candidate(pid);
        assert_eq!(a.resolve_many(&[peer]), vec![Some(pid)], "batch fallback");
        a.cache.lock().unwrap().clear();
        a.add_server(listener.local_addr().unwrap());
        assert_eq!(a.resolve(peer), Some(pid), "netlink");
        nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        leader.wait().unwrap();
    }

    #[test]
    fn netlink_finds_the_client_socket_proc_net_tcp_lists() {
        let (listener, client, _accepted, peer) = pair();
        let server = listener.local_addr().unwrap();
        let mut diag = SockDiag::open().expect("NETLINK_SOCK_DIAG");
        let inode = socket_inode(peer).expect("listed in /proc/net/tcp");
        let other_family: SocketAddr = "[::1]:9".parse().unwrap();
        assert_eq!(
            diag.find(peer, &[other_family, server]).unwrap(),
            Some(inode)
        );
        assert_eq!(
            diag.find("127.0.0.1:1".parse().unwrap(), &[server])
                .unwrap(),
            None,
            "no such socket"
        );
        drop(client);
        assert_eq!(
            diag.find(peer, &[server]).unwrap(),
            None,
            "a closed client socket has no inode"
        );
    }

    #[tokio::test]
    async fn connected_remembers_what_it_found_until_the_next_connection() {
        let (listener, client, _accepted, peer) = pair();
        let me = std::process::id();
        let a = Attributor::new();
        a.add_server(listener.local_addr().unwrap());
        a.add_candidate(me);
        assert_eq!(a.sender(peer), None);
        assert_eq!(a.connected(peer).await, Found::Sender(me));
        drop(client);
        assert_eq!(a.sender(peer), Some(me), "still known after the close");
        // A new connection from the same address whose client closed before the lookup.
        assert_eq!(a.connected(peer).await, Found::Closed);
        assert_eq!(
            a.sender(peer),
            None,
            "the old connection's sender is forgotten"
        );
        assert_eq!(a.connection(peer), Some(Found::Closed));
        // An open socket no candidate holds is not remembered: the fallback may place it later.
        let (listener, _client, _accepted, peer) = pair();
        let b = Attributor::new();
        b.add_server(listener.local_addr().unwrap());
        assert_eq!(b.connected(peer).await, Found::Unknown);
        assert_eq!(b.connection(peer), None);
    }

    /// The figures in the module docs: `cargo test --release --lib attribution -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "timing, not a check"]
    fn measure_single_lookups() {
        let (listener, _client, _accepted, peer) = pair();
        let server = listener.local_addr().unwrap();
        let mut diag = SockDiag::open().expect("NETLINK_SOCK_DIAG");
        let per = |n: u32, f: &mut dyn FnMut()| {
            let t = std::time::Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        };
        let hit = per(20_000, &mut || {
            assert!(diag.find(peer, &[server]).unwrap().is_some())
        });
        let miss = per(20_000, &mut || {
            assert!(diag.find(peer, &[peer]).unwrap().is_none())
        });
        let proc = per(50, &mut || assert!(socket_inode(peer).is_some()));
        let a = Attributor::new();
        a.add_candidate(std::process::id());
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
        let scan = per(2_000, &mut || {
            a.cache.lock().unwrap().clear();
            a.add_server(server);
            assert!(a.resolve(peer).is_some());
            a.servers.write().unwrap().clear();
        });
        let sockets = std::fs::read_to_string("/proc/net/tcp")
            .unwrap()
            .lines()
            .count()
            - 1;
        println!(
            "netlink exact lookup {hit:.1} µs (miss {miss:.1} µs); /proc/net/tcp read {proc:.0} µs \
             with {sockets} sockets; netlink + fd scan of one process with {fds} fds {scan:.1} µs"
        );
    }
}
