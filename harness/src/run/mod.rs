//! `ting-chaos run`: one experiment from start to verdict.
//!
//! Provision the database, start the fake providers in-process, start the stack through the
//! contract (migrate, API, N workers), enqueue the load while the chaos schedule runs, wait for
//! quiescence, stop everything, check, and write the report. Teardown runs on every path; the
//! caller interrupts [`run`] by resolving `interrupt` (Ctrl-C, SIGTERM).

mod chaos;
mod env;
mod not_accepted;
mod progress;
mod settle;
mod status;
mod watch;
mod world;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mock_providers::ledger::{EntryKind, Ledger};

use crate::check::{self, EventKind, Quiescence, Role, StatusDelivery};
use crate::exit;
use crate::load::{self, recipients, Plan};
use crate::report::{self, Report};
use crate::scenario::{Channel, Scenario, StackKind};
use crate::supervise::{Spec, Supervisor};

pub use world::WorkerCommand;

/// Flags of `ting-chaos run` that override the scenario.
#[derive(Debug, Default)]
pub struct RunOptions {
    pub seed: Option<u64>,
    pub workers: Option<u32>,
    pub database_url: Option<String>,
    pub report_root: PathBuf,
    pub keep: bool,
    /// The `ting-chaos` executable, for the built-in stack's processes.
    pub self_exe: PathBuf,
    /// Print progress lines (stderr).
    pub progress: bool,
    /// A previous run's report and the tolerance (share) for throughput/latency regressions.
    pub baseline: Option<(Report, f64)>,
}

/// How a run ended.
pub struct Outcome {
    pub exit_code: i32,
    pub report_dir: PathBuf,
    pub report: Option<Report>,
}

/// An error that makes the run an infrastructure failure (exit 3), not a verdict.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InfraError(pub String);

/// Past its deadline a run keeps waiting while some delivery settled within this long.
const QUIESCENCE_PROGRESS: Duration = Duration::from_secs(10);

fn infra(msg: impl Into<String>) -> anyhow::Error {
    InfraError(msg.into()).into()
}

/// Runs `scenario` and returns its outcome; resolving `interrupt` stops it early (exit 130).
pub async fn run(
    mut scenario: Scenario,
    opts: RunOptions,
    interrupt: impl Future<Output = ()>,
) -> Outcome {
    if let Some(seed) = opts.seed {
        scenario.seed = seed;
    }
    if let Some(w) = opts.workers {
        scenario.stack.workers = w;
    }
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let report_dir = opts.report_root.join(format!("{}-{stamp}", scenario.name));
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut res = Resources::default();
    let body = execute(
        &scenario,
        &opts,
        &report_dir,
        &mut res,
        (started, &started_at),
    );
    let result = tokio::select! {
        r = body => Some(r),
        _ = interrupt => None,
    };
    // Teardown on every path: stack processes first, then providers, then the database.
    res.teardown(&scenario).await;
    let (exit_code, report) = match result {
        None => {
            eprintln!(
                "interrupted: stack stopped, database cleaned up; logs in {}",
                report_dir.display()
            );
            (130, None)
        }
        Some(Ok(r)) => (r.exit_code, Some(r)),
        Some(Err(e)) => {
            // Anything that stops a run before its verdict is the infrastructure's failure.
            let code = exit::INFRA;
            let mut r = res.partial_report(&scenario, &format!("{e:#}"));
            r.exit_code = code;
            r.duration_ms = started.elapsed().as_millis() as u64;
            r.started_at = started_at;
            (code, Some(r))
        }
    };
    if let Some(r) = &report {
        if std::fs::create_dir_all(&report_dir).is_ok() {
            if let Err(e) = report::write_json_atomic(&report_dir.join("report.json"), r) {
                eprintln!("error: could not write report: {e:#}");
            }
        }
    }
    Outcome {
        exit_code,
        report_dir,
        report,
    }
}

/// What must be torn down, filled in as the run starts things.
#[derive(Default)]
struct Resources {
    supervisor: Option<Supervisor>,
    providers: Option<mock_providers::Providers>,
    database: Option<Arc<tokio::sync::Mutex<Option<throwaway_pg::Database>>>>,
    chaos: Option<Arc<chaos::Chaos>>,
    world: Option<Arc<world::World>>,
    keep: bool,
}

impl Resources {
    async fn teardown(&mut self, scenario: &Scenario) {
        if let Some(c) = self.chaos.take() {
            c.stop();
        }
        if let Some(s) = self.supervisor.take() {
            s.shutdown_all(scenario.stack.shutdown_grace.max(Duration::from_secs(1)))
                .await;
        }
        if let Some(p) = self.providers.take() {
            p.shutdown().await;
        }
        if let Some(db) = self.database.take() {
            // Chaos tasks may still hold the handle; taking the value out closes it regardless.
            let db = db.lock().await.take();
            if let Some(db) = db {
                let url = db.url().to_string();
                if let Err(e) = db.close().await {
                    eprintln!("warning: database cleanup: {e}");
                } else if self.keep {
                    eprintln!("kept database {url}");
                }
            }
        }
    }

    fn partial_report(&self, s: &Scenario, error: &str) -> Report {
        let world = self.world.as_ref();
        Report {
            format: report::FORMAT,
            tool: tool(),
            scenario_name: s.name.clone(),
            seed: s.seed,
            scenario: serde_json::to_value(s).unwrap_or_default(),
            started_at: String::new(),
            duration_ms: 0,
            exit_code: exit::INFRA,
            verdict: "error".into(),
            error: Some(error.into()),
            database: report::DatabaseInfo {
                kind: db_kind(s),
                server_version: None,
            },
            load: Default::default(),
            ledger_summary: world
                .map(|w| ledger_summary(&w.ledger.snapshot()))
                .unwrap_or_default(),
            callbacks_sent: 0,
            checks: Vec::new(),
            quiescence: None,
            timeline: world.map(|w| w.timeline()).unwrap_or_default(),
            processes: world.map(|w| w.supervisor.records()).unwrap_or_default(),
            chaos_unfired: Vec::new(),
            chaos_steps: self.chaos.as_ref().map(|c| c.results()).unwrap_or_default(),
            files: BTreeMap::new(),
            regressions: Vec::new(),
            gates: Vec::new(),
            sends_by_pid: Default::default(),
            sends_unattributed: None,
            sends_sender_gone: None,
            machine: None,
            harness: None,
            metrics: Default::default(),
            latency: None,
            uncertain: None,
        }
    }
}

fn tool() -> report::Tool {
    report::Tool {
        name: "ting-chaos".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    }
}

fn db_kind(s: &Scenario) -> String {
    if s.database.url.is_some() {
        "server".into()
    } else {
        "throwaway".into()
    }
}

/// Counts of send attempts by provider and outcome.
fn ledger_summary(
    entries: &[mock_providers::ledger::LedgerEntry],
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut m: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for e in entries.iter().filter(|e| e.kind == EntryKind::Send) {
        let outcome = serde_json::to_value(e.outcome)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        *m.entry(e.provider.as_str().into())
            .or_default()
            .entry(outcome)
            .or_default() += 1;
    }
    m
}

/// The address the stack's API is told to listen on: free now, and outside the kernel's
/// ephemeral range so that no outgoing connection can take it before the API binds it.
fn free_port() -> anyhow::Result<SocketAddr> {
    let port = throwaway_pg::free_port().context("find a free port for the stack's API")?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

async fn execute(
    scenario: &Scenario,
    opts: &RunOptions,
    report_dir: &Path,
    res: &mut Resources,
    (started, started_at): (Instant, &str),
) -> anyhow::Result<Report> {
    std::fs::create_dir_all(report_dir)
        .with_context(|| format!("create {}", report_dir.display()))?;
    let cpu_mark = crate::cpu::mark();
    let mut progress = progress::Progress::new(opts.progress);
    let say = |msg: String| progress.say(&msg);
    // The ledger's clock is the run's clock: every timeline event and progress line uses it.
    let ledger = Ledger::new();
    let t0 = Instant::now();
    let probe = {
        let ledger = ledger.clone();
        crate::stalls::StallProbe::start(move || ledger.now_ns())
    };

    // 1. Database.
    let server_url = opts
        .database_url
        .clone()
        .or_else(|| scenario.database.url.clone())
        .or_else(|| std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()));
    let keep = opts.keep || scenario.database.keep;
    res.keep = keep;
    let pg_opts = throwaway_pg::ClusterOptions {
        max_connections: 60 + scenario.stack.workers * 16,
        ..Default::default()
    };
    let database = throwaway_pg::Database::provision(server_url.as_deref(), pg_opts, keep)
        .await
        .map_err(|e| infra(format!("database: {e}")))?;
    let db_url = database.url().to_string();
    let admin_url = database.admin_url();
    let throwaway = database.cluster().is_some();
    let database = Arc::new(tokio::sync::Mutex::new(Some(database)));
    res.database = Some(database.clone());
    say(format!(
        "[{:>5.1}s] database ready ({})",
        t0.elapsed().as_secs_f64(),
        if throwaway {
            "throwaway cluster"
        } else {
            "server"
        }
    ));

    // 2. Providers, in-process.
    let api_addr = free_port()?;
    let mut providers_cfg = scenario.providers.clone();
    if providers_cfg.smtp.events.enabled && providers_cfg.smtp.events.url.is_none() {
        providers_cfg.smtp.events.url = Some(format!("http://{api_addr}/v1/callbacks/email"));
    }
    let providers = mock_providers::start(
        scenario.seed,
        providers_cfg.clone(),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        ledger.clone(),
    )
    .await
    .map_err(|e| infra(format!("fake providers: {e:#}")))?;
    let endpoints = env::Endpoints {
        database_url: db_url.clone(),
        api_addr,
        line: providers.line_addr,
        smtp: providers.smtp_addr,
        sms: providers.sms_addr,
    };
    let attributor = crate::attribution::Attributor::new();
    for addr in providers.server_addrs() {
        attributor.add_server(addr);
    }
    res.providers = Some(providers);

    // 3. The stack, through the contract.
    let supervisor = Supervisor::new(&report_dir.join("logs"), ledger.clone())?;
    res.supervisor = Some(supervisor.clone());
    let env = env::contract_env(scenario, &providers_cfg, &endpoints);
    let (api_argv, worker_argv, migrate_argv, cwd) =
        match (&scenario.stack.kind, &scenario.stack.external) {
            (StackKind::External, Some(x)) => (
                x.api.clone(),
                x.worker.clone(),
                x.migrate.clone(),
                Some(x.cwd.clone()),
            ),
            _ => {
                let me = opts.self_exe.display().to_string();
                let role = |r: &str| vec![me.clone(), "stack".into(), r.into()];
                (role("api"), role("worker"), role("migrate"), None)
            }
        };
    let world = world::World::new(
        scenario.clone(),
        ledger.clone(),
        supervisor.clone(),
        attributor.clone(),
        WorkerCommand {
            argv: worker_argv,
            env: env.clone(),
            cwd: cwd.clone(),
        },
    );
    res.world = Some(world.clone());
    world.spawn_resolver();
    *world.printer.lock().unwrap() = progress.printer();

    // The plan, the chaos schedule and the ledger hook exist before the stack starts, so that the
    // hook sees (and attributes) every connection the stack opens to the providers.
    // The trickle's recipients come after the batches', from the same seeded sequence.
    let mut people = recipients::of_run(scenario);
    let trickle_people = people.split_off(scenario.load.recipients as usize);
    let plan = Plan::new(scenario, people.len());
    let mut expected = recipients::expected(scenario, &people, |i| plan.batch_of(i));
    // The batches' deliveries; the trickle's orders are appended after them as they start.
    let mut batch_deliveries = expected.len();
    let acceptable = expected.iter().filter(|e| !e.bad).count() as u64;
    // Per channel, the deliveries the providers can accept: the progress display's "expected".
    let mut acceptable_by: BTreeMap<Channel, u64> = BTreeMap::new();
    for e in &expected {
        *acceptable_by.entry(e.channel).or_default() += u64::from(!e.bad);
    }
    let chaos = chaos::Chaos::new(
        world.clone(),
        chaos::DbHandle {
            url: db_url.clone(),
            admin_url: admin_url.clone(),
            database: database.clone(),
        },
        acceptable,
    );
    res.chaos = Some(chaos.clone());
    ledger.add_hook(Arc::new(world::Observer::new(
        world.clone(),
        chaos.clone(),
        expected
            .iter()
            .map(|e| (e.channel.provider(), e.address.clone())),
    )));

    let spec = |role: Role, argv: Vec<String>| Spec {
        role,
        slot: None,
        worker_id: None,
        argv,
        env: env.clone(),
        cwd: cwd.clone(),
    };
    let mig = supervisor
        .spawn(spec(Role::Migrate, migrate_argv))
        .await
        .map_err(|e| infra(format!("stack migrate could not start: {e:#}")))?;
    if !supervisor.wait_exit(mig, Duration::from_secs(120)).await {
        return Err(infra("stack migrate did not finish within 120s"));
    }
    let rec = supervisor.record(mig).expect("migrate record");
    if rec.exit_code != Some(0) {
        return Err(infra(format!(
            "stack migrate failed (exit {:?}, signal {:?}); see {}",
            rec.exit_code,
            rec.signal,
            report_dir.join("logs").join(&rec.log).display()
        )));
    }
    let api_pid = supervisor
        .spawn(spec(Role::Api, api_argv))
        .await
        .map_err(|e| infra(format!("stack api could not start: {e:#}")))?;
    attributor.add_candidate(api_pid);
    let api_base = format!("http://{api_addr}");
    wait_healthy(&supervisor, api_pid, &api_base, Duration::from_secs(30)).await?;
    world.event(EventKind::ApiReady, None, Some(api_pid), api_base.clone());
    for slot in 1..=scenario.stack.workers {
        world
            .start_worker(slot)
            .await
            .map_err(|e| infra(format!("stack worker could not start: {e:#}")))?;
    }
    say(format!(
        "[{:>5.1}s] stack up: api pid {api_pid}, {} workers",
        t0.elapsed().as_secs_f64(),
        scenario.stack.workers
    ));

    // 4. Load and chaos.
    let load_start = Instant::now();
    world.event(
        EventKind::LoadStart,
        None,
        None,
        format!(
            "{} recipients × {} channels in {} batches",
            people.len(),
            scenario.load.channels.len(),
            plan.batches.len()
        ),
    );
    chaos.start(load_start);
    let clock = {
        let ledger = ledger.clone();
        Arc::new(move || ledger.now_ns()) as load::Clock
    };
    let poster = load::Poster::new(scenario, &api_base, clock);
    let trickle = scenario
        .load
        .trickle
        .as_ref()
        .map(|t| load::TrickleRun::start(t, poster.clone(), trickle_people));
    // A crash is reported the moment it is seen, during the load too; a crash that leaves nothing
    // able to make progress ends the load and the wait for quiescence.
    let mut watch = watch::CrashWatch::new(world.clone(), chaos.clone());
    let loaded = {
        let watching = async {
            loop {
                if let Some(why) = watch.poll() {
                    break why;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::select! {
            r = load::enqueue(&poster, &people, &plan) => Ok(r),
            why = watching => Err(why),
        }
    };
    let (mut enqueue, mut stopped_early) = match loaded {
        Ok(Ok(e)) => (e, None),
        // An enqueue that failed because the API crashed is the stack's failure, not ours.
        Ok(Err(e)) => {
            supervisor.wait_exit(api_pid, Duration::from_secs(1)).await;
            match watch.poll() {
                Some(why) => (load::Enqueued::new(), Some(why)),
                None => return Err(infra(format!("{e}"))),
            }
        }
        Err(why) => (load::Enqueued::new(), Some(why)),
    };
    let gone = enqueue
        .failures
        .not_accepted
        .iter()
        .map(|b| b.batch_id.as_str());
    batch_deliveries -= not_accepted::forget(&mut expected, gone);
    world.event(
        EventKind::LoadDone,
        None,
        None,
        format!(
            "{} batches enqueued, {} never accepted",
            plan.batches.len() - enqueue.failures.not_accepted.len(),
            enqueue.failures.not_accepted.len()
        ),
    );

    // 5. Quiescence.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    // Only batches the stack accepted (202/200): a 404 for one of them is a lost batch. The
    // trickle's orders join as they are accepted.
    let mut batch_ids: Vec<String> = enqueue.batches.iter().map(|b| b.batch_id.clone()).collect();
    let callback_channels: Vec<Channel> = [
        (Channel::Sms, providers_cfg.sms.callbacks.enabled),
        (Channel::Email, providers_cfg.smtp.events.enabled),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(c, _)| c)
    .collect();
    let mut tracker = settle::Tracker::new(&expected, scenario.expect.max_attempts);
    let deadline = Instant::now() + scenario.expect.quiescence;
    // A stack still settling deliveries at the deadline is slow, not stuck: the wait goes on while
    // it makes progress (fewer deliveries open within QUIESCENCE_PROGRESS), up to three times the
    // deadline in all. The deadline is a stall detector, not a throughput requirement.
    let hard_deadline = deadline + scenario.expect.quiescence * 2;
    let (mut fewest_open, mut last_progress) = (usize::MAX, Instant::now());
    let settle_for = scenario.stack.lease + scenario.stack.heartbeat;
    let mut status_view = status::StatusPoller::new();
    let mut status: Option<Vec<StatusDelivery>> = None;
    let mut last_print = Instant::now();
    let mut last_status: Option<Instant> = None;
    let mut calm_since: Option<Instant> = None;
    let quiescence = loop {
        // Read before taking its orders: a trickle finished by now has published them all.
        let trickling = trickle.as_ref().is_some_and(|t| !t.is_finished());
        // The trickle's new orders are known before their requests are sent, so before the
        // ledger can hold any of their sends.
        for order in trickle.iter().flat_map(|t| t.take_new()) {
            tracker.extend(&order.expected);
            expected.extend(order.expected);
        }
        batch_ids.extend(trickle.iter().flat_map(|t| t.take_accepted()));
        if let Some(t) = &trickle {
            let (ids, max) = (t.take_not_accepted(), scenario.expect.max_attempts);
            not_accepted::forget_tracked(&mut expected, &ids, &mut tracker, max, &ledger);
        }
        tracker.feed(&ledger.since(tracker.next_seq()));
        if stopped_early.is_none() {
            stopped_early = watch.poll();
        }
        if let Some(why) = &stopped_early {
            world.event(EventKind::StoppedEarly, None, None, why.clone());
            break Quiescence {
                reached: false,
                at_ns: world.now_ns(),
                open: tracker.open(&expected, None, &callback_channels),
                awaiting_report: Vec::new(),
                past_deadline_ms: None,
                callbacks_pending: 0,
                stopped_early: stopped_early.clone(),
            };
        }
        // The status API returns every delivery with its transitions (megabytes for a big batch):
        // once a second is plenty, and keeps the poll from competing with the stack for the CPU.
        if status_view.enabled()
            && !matches!(last_status, Some(t) if t.elapsed() < Duration::from_secs(1))
        {
            last_status = Some(Instant::now());
            // Batches with a delivery the ledger has not settled are open whatever the stack says.
            let unsettled: std::collections::HashSet<&str> =
                tracker.open_batches(&expected).into_iter().collect();
            if let Err(e) = status_view
                .poll_some(
                    &client,
                    &api_base,
                    &batch_ids,
                    |id| !unsettled.contains(id),
                    world.now_ns(),
                )
                .await
            {
                tracing::warn!("status API: {e:#}");
            }
            status = status_view.rows();
        }
        if let Some(t) = &trickle {
            // The trickle runs while the batches drain (and past that, up to its minimum).
            let batches = &expected[..batch_deliveries];
            if tracker
                .open(batches, status.as_deref(), &callback_channels)
                .is_empty()
            {
                t.stop();
            }
        }
        let open = tracker.open(&expected, status.as_deref(), &callback_channels);
        let pending = res
            .providers
            .as_ref()
            .map(|p| p.pending_callbacks())
            .unwrap_or(0);
        let calm = open.is_empty() && pending == 0 && !chaos.busy() && !trickling;
        calm_since = if calm {
            calm_since.or(Some(Instant::now()))
        } else {
            None
        };
        if opts.progress && last_print.elapsed() >= Duration::from_millis(250) {
            last_print = Instant::now();
            let snap = progress::Snapshot {
                elapsed_s: t0.elapsed().as_secs_f64(),
                accepted: acceptable_by
                    .iter()
                    .map(|(c, n)| (*c, (world.accepted_on(c.provider()), *n)))
                    .collect(),
                faults: world.faults_injected(),
                callbacks_due: pending,
                workers_alive: world.live_workers().len(),
            };
            progress.update(&snap);
        }
        if calm_since.is_some_and(|t| t.elapsed() >= settle_for) {
            break Quiescence {
                reached: true,
                at_ns: world.now_ns(),
                open,
                awaiting_report: Vec::new(),
                past_deadline_ms: Instant::now()
                    .checked_duration_since(deadline)
                    .map(|d| d.as_millis() as u64),
                callbacks_pending: pending,
                stopped_early: None,
            };
        }
        if open.len() < fewest_open {
            (fewest_open, last_progress) = (open.len(), Instant::now());
        }
        let progressing = last_progress.elapsed() < QUIESCENCE_PROGRESS;
        if Instant::now() >= deadline && (!progressing || Instant::now() >= hard_deadline) {
            // Open only for a delivery report the fakes did send and no longer have due
            // (delivered, or given up after its retries): the stack may be waiting for a report
            // it never got. A row no report was ever sent for stays open.
            let awaiting_report = if pending == 0 {
                let without = tracker.open(&expected, status.as_deref(), &[]);
                let reported = settle::reported(&ledger.snapshot(), &expected);
                open.iter()
                    .filter(|d| !without.contains(d) && reported.contains(d.as_str()))
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            };
            break Quiescence {
                reached: false,
                at_ns: world.now_ns(),
                open,
                awaiting_report,
                past_deadline_ms: Instant::now()
                    .checked_duration_since(deadline)
                    .map(|d| d.as_millis() as u64),
                callbacks_pending: pending,
                stopped_early: None,
            };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    if quiescence.stopped_early.is_none() {
        world.event(
            if quiescence.reached {
                EventKind::Quiescent
            } else {
                EventKind::Deadline
            },
            None,
            None,
            format!("{} open", quiescence.open.len()),
        );
    }
    match trickle {
        // After a crash that stopped the run its orders would only wait for a dead API.
        Some(t) if quiescence.stopped_early.is_some() => t.abort(),
        Some(t) => {
            // At the deadline the trickle may still be sending: its last orders are judged too.
            let (orders, late) = t.finish().await.map_err(|e| infra(format!("{e}")))?;
            for order in late {
                expected.extend(order.expected);
            }
            batch_ids.extend(orders.batches.iter().map(|b| b.batch_id.clone()));
            batch_ids.sort();
            batch_ids.dedup();
            enqueue.merge(orders);
        }
        None => {}
    }
    let gone = enqueue
        .failures
        .not_accepted
        .iter()
        .map(|b| b.batch_id.as_str());
    not_accepted::forget(&mut expected, gone);
    if status_view.enabled() {
        if let Err(e) = status_view
            .poll(&client, &api_base, &batch_ids, true, world.now_ns())
            .await
        {
            tracing::warn!("status API: {e:#}");
        }
    }
    let status = status_view.rows();
    let lost_batches = status_view.lost();
    progress.finish();
    *world.printer.lock().unwrap() = None;
    chaos.stop();
    let chaos_steps = chaos.results();

    // 6. Stop the stack, then judge.
    supervisor
        .shutdown_all(scenario.stack.shutdown_grace.max(Duration::from_secs(1)))
        .await;
    res.supervisor = None;
    world.resolve_pending();
    let entries = ledger.snapshot();
    let pids = world.pids();
    let timeline = world.timeline();
    let processes = supervisor.records();
    let stalls = probe.finish();
    let input = check::Input {
        scenario,
        expected: &expected,
        ledger: &entries,
        pids: &pids,
        status: status.as_deref(),
        timeline: &timeline,
        processes: &processes,
        enqueue_us: &enqueue.latency_us,
        batches: &enqueue.batches,
        repeats: &enqueue.repeats,
        enqueue_failures: &enqueue.failures,
        quiescence: &quiescence,
        lost_batches: &lost_batches,
        stalls: &stalls,
    };
    let checks = check::run_all(&input);

    // 7. Files.
    let mut files = BTreeMap::new();
    let ledger_path = report_dir.join("ledger.jsonl");
    report::atomic::write_atomic(&ledger_path, |w| ledger.write_jsonl(w))?;
    files.insert("ledger".into(), "ledger.jsonl".into());
    files.insert("logs".into(), "logs/".into());
    if let Some(rows) = &status {
        report::write_json_atomic(&report_dir.join("status.json"), rows)?;
        files.insert("status".into(), "status.json".into());
    }
    let server_version = server_version(&db_url).await;
    let mut report = Report {
        format: report::FORMAT,
        tool: tool(),
        scenario_name: scenario.name.clone(),
        seed: scenario.seed,
        scenario: serde_json::to_value(scenario)?,
        started_at: String::new(),
        duration_ms: 0,
        // Set below from the checks and gates by `verdict::overall`.
        exit_code: exit::OK,
        verdict: String::new(),
        error: None,
        database: report::DatabaseInfo {
            kind: if throwaway {
                "throwaway".into()
            } else {
                "server".into()
            },
            server_version,
        },
        load: report::LoadSummary {
            recipients: scenario.load.recipients,
            channels: scenario
                .load
                .channels
                .iter()
                .map(|c| c.as_str().to_string())
                .collect(),
            batches: plan.batches.len() as u32,
            expected_deliveries: expected.len() as u64,
            bad_address_deliveries: expected.iter().filter(|e| e.bad).count() as u64,
            enqueue_latency_ms: report::Percentiles::from_us(&enqueue.latency_us),
            batch_enqueues: enqueue.batches.clone(),
            repeats: enqueue.repeats.clone(),
            enqueue_failures: enqueue.failures.clone(),
        },
        ledger_summary: ledger_summary(&entries),
        callbacks_sent: entries
            .iter()
            .filter(|e| e.kind == EntryKind::Callback)
            .count() as u64,
        uncertain: Some(report::uncertain(&entries, &checks)),
        checks,
        quiescence: Some(quiescence),
        timeline,
        processes,
        chaos_unfired: report::chaos_steps::unfired(&chaos_steps),
        chaos_steps,
        files,
        regressions: Vec::new(),
        gates: Vec::new(),
        sends_by_pid: report::sends_by_pid(&entries, &pids),
        sends_unattributed: Some(report::sends_unattributed(&entries, &pids)),
        sends_sender_gone: Some(world.sends_sender_gone()),
        machine: Some(crate::stalls::StallSummary::of(&stalls)),
        harness: crate::cpu::HarnessUsage::since(cpu_mark),
        metrics: Default::default(),
        latency: Some(report::latency(
            &entries,
            &enqueue.latency_us,
            &report::enqueue_times(&expected, &enqueue.batches),
        )),
    };
    report.metrics = report::metrics(&report, &entries);
    report.started_at = started_at.to_string();
    report.duration_ms = started.elapsed().as_millis() as u64;
    // Performance gates: absolute thresholds from [expect], then a baseline report if given.
    report.gates = report::gate::evaluate(
        &report.metrics,
        &scenario.expect.thresholds,
        opts.baseline
            .as_ref()
            .map(|(base, tol)| (&base.metrics, *tol)),
    );
    report.regressions = report
        .gates
        .iter()
        .filter(|g| !g.passed && !g.insufficient)
        .map(|g| g.message.clone())
        .collect();
    // A chaos step that did not take effect keeps the run from passing (inconclusive).
    let not_applied = report::chaos_steps::not_applied(&report.chaos_steps);
    let overall = crate::verdict::overall(&report.checks, &report.gates, &not_applied);
    report.exit_code = overall.exit_code();
    report.verdict = overall.verdict.as_str().into();
    render_outputs(
        report_dir,
        &mut report,
        &entries,
        report::step_summary_path().as_deref(),
    );
    Ok(report)
}

/// Writes `report.html`, `junit.xml` and `summary.md` (and appends to the step summary) and
/// lists them in `report.files`. A rendering that fails is recorded in `error`, and makes a
/// passing run an infrastructure failure (exit 3, verdict `error`): CI must not pass a run whose
/// results it cannot show. A run that found a violation keeps exit 1 and `fail`: the stack's bug
/// is the news, and `report.json` still carries it.
fn render_outputs(
    dir: &Path,
    report: &mut Report,
    entries: &[mock_providers::ledger::LedgerEntry],
    step_summary: Option<&Path>,
) {
    match report::write_rendered(dir, report, entries, step_summary) {
        Ok(written) => {
            for w in written {
                let name = w
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                let key = name
                    .split('.')
                    .next()
                    .unwrap_or_default()
                    .replace("report", "html");
                report.files.insert(key, name);
            }
        }
        Err(e) => {
            let msg = format!("could not render report.html, junit.xml and summary.md: {e:#}");
            eprintln!("error: {msg}");
            report.error = Some(msg);
            if report.exit_code == exit::OK {
                report.exit_code = exit::INFRA;
                report.verdict = "error".into();
            }
        }
    }
}

/// The load's record when it was cut short before any batch was measured.
async fn server_version(url: &str) -> Option<String> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    sqlx::query_scalar::<_, String>("SHOW server_version")
        .fetch_one(&mut c)
        .await
        .ok()
}

async fn wait_healthy(
    sup: &Supervisor,
    pid: u32,
    base: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if !sup.is_alive(pid) {
            let rec = sup.record(pid);
            return Err(infra(format!(
                "stack api exited before becoming healthy (exit {:?}); see its log {}",
                rec.as_ref().and_then(|r| r.exit_code),
                rec.map(|r| r.log).unwrap_or_default()
            )));
        }
        if Instant::now() >= deadline {
            return Err(infra(format!(
                "stack api never answered GET {base}/healthz within {}s",
                within.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let data = include_str!("../../../tests/fixtures/report-sample/report.json");
        serde_json::from_str(data).expect("fixture report")
    }

    #[test]
    fn a_failed_rendering_fails_a_passing_run_and_keeps_a_violation() {
        let dir = tempfile::tempdir().unwrap();
        // Written where no file can be: a folder that does not exist.
        let missing = dir.path().join("missing");
        let mut passed = report();
        (passed.exit_code, passed.verdict) = (exit::OK, "pass".into());
        render_outputs(&missing, &mut passed, &[], None);
        assert_eq!(
            (passed.exit_code, passed.verdict.as_str()),
            (exit::INFRA, "error")
        );
        let err = passed.error.as_deref().unwrap_or_default();
        assert!(err.starts_with("could not render report.html"), "{err}");
        let mut r = report();
        assert_eq!(r.exit_code, exit::VIOLATION);
        render_outputs(&missing, &mut r, &[], None);
        assert_eq!((r.exit_code, r.verdict.as_str()), (exit::VIOLATION, "fail"));
        assert!(r.error.is_some());

        // The same report renders into a folder that exists, and lists the files.
        let mut r = report();
        r.files.clear();
        render_outputs(dir.path(), &mut r, &[], None);
        assert_eq!(r.exit_code, exit::VIOLATION);
        assert!(r.error.is_none());
        let files: Vec<&str> = r.files.values().map(String::as_str).collect();
        assert_eq!(files, ["report.html", "junit.xml", "summary.md"]);
    }
}
