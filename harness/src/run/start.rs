//! The run's second phase: the workload it will send (recipients, batches, what each delivery
//! should become) and the stack, started through the contract — migrate to completion, the API
//! until healthy, then every worker — with the chaos schedule and the ledger hook in place
//! before the stack opens its first provider connection.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_providers::ledger::Ledger;

use super::provision::{Database, Fakes};
use super::{
    chaos, db_links, env, infra, journal, progress, world, Resources, RunOptions, WorkerCommand,
};
use crate::check::{EventKind, Expected, Role};
use crate::load::{recipients, Plan, Recipient};
use crate::netchaos::LinkOwner;
use crate::scenario::{Channel, Scenario, StackKind};
use crate::supervise::{Spec, Supervisor};

/// What the run will send and expects to see: known before anything starts, from the seed.
pub(super) struct Workload {
    /// The batches' recipients.
    pub people: Vec<Recipient>,
    /// The trickle's recipients, after the batches' in the same seeded sequence; taken by the
    /// load phase.
    pub trickle_people: Vec<Recipient>,
    pub plan: Plan,
    /// Every delivery the run expects: the batches', then the trickle's orders as they start.
    pub expected: Vec<Expected>,
    /// How many of `expected` are the batches'.
    pub batch_deliveries: usize,
    /// Per channel, the deliveries the providers can accept: the progress display's "expected".
    pub acceptable_by: BTreeMap<Channel, u64>,
}

impl Workload {
    pub fn of(scenario: &Scenario) -> Workload {
        let mut people = recipients::of_run(scenario);
        let trickle_people = people.split_off(scenario.load.recipients as usize);
        let plan = Plan::new(scenario, people.len());
        let expected = recipients::expected(scenario, &people, |i| plan.batch_of(scenario, i));
        let acceptable_by = acceptable_by(&expected);
        Workload {
            people,
            trickle_people,
            batch_deliveries: expected.len(),
            plan,
            expected,
            acceptable_by,
        }
    }

    /// Drops the deliveries of batches the stack never accepted (`not_accepted::forget`) from
    /// what the run expects and from the progress display's totals alike.
    pub fn forget_batches<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>) {
        self.batch_deliveries -= super::not_accepted::forget(&mut self.expected, ids);
        self.acceptable_by = acceptable_by(&self.expected[..self.batch_deliveries]);
    }
}

/// Per channel, how many of `expected` the providers can accept (not seeded bad addresses).
fn acceptable_by(expected: &[Expected]) -> BTreeMap<Channel, u64> {
    let mut by: BTreeMap<Channel, u64> = BTreeMap::new();
    for e in expected {
        *by.entry(e.channel).or_default() += u64::from(!e.bad);
    }
    by
}

/// The running stack and what acts on it.
pub(super) struct Stack {
    pub supervisor: Supervisor,
    pub world: Arc<world::World>,
    pub chaos: Arc<chaos::Chaos>,
    pub api_pid: u32,
    pub api_base: String,
}

/// Starts the stack through the contract. Every process it starts is the supervisor's, which
/// `res` tears down on every path.
pub(super) async fn stack(
    scenario: &Scenario,
    opts: &RunOptions,
    report_dir: &Path,
    (ledger, progress): (&Ledger, &progress::Progress),
    db: &Database,
    fakes: &Fakes,
    work: &Workload,
    res: &mut Resources,
) -> anyhow::Result<Stack> {
    let supervisor = Supervisor::new(&report_dir.join("logs"), ledger.clone())?;
    res.supervisor = Some(supervisor.clone());
    let env = env::contract_env(scenario, &fakes.config, &fakes.endpoints);
    let commands = Commands::of(scenario, opts);
    // From here on the ledger goes to ledger.jsonl as it is recorded.
    let keep = crate::check::immutable_payload::html_kept(scenario);
    // The ledger's entries and the status view name the expected deliveries with `expected`'s
    // own copies.
    let names = crate::check::Interner::default();
    for e in &work.expected {
        names.adopt(&e.address);
        names.adopt(&e.recipient);
    }
    let journal = journal::Journal::start(ledger, report_dir, (keep, names), work.expected.len())?;
    let world = world::World::new(
        scenario.clone(),
        (ledger.clone(), journal),
        supervisor.clone(),
        fakes.attributor.clone(),
        WorkerCommand {
            argv: commands.worker,
            env: env.clone(),
            cwd: commands.cwd.clone(),
            db_links: db_links::for_run(scenario, &db.url).map_err(|e| infra(format!("{e:#}")))?,
        },
    );
    res.world = Some(world.clone());
    world.spawn_resolver();
    *world.printer.lock().unwrap() = progress.printer();
    // The chaos schedule and the ledger hook exist before the stack starts, so that the hook sees
    // (and attributes) every connection the stack opens to the providers.
    let chaos = chaos::Chaos::new(
        world.clone(),
        chaos::DbHandle {
            url: db.url.clone(),
            admin_url: db.admin_url.clone(),
            database: db.handle.clone(),
        },
        work.acceptable_by.clone(),
    );
    res.chaos = Some(chaos.clone());
    let providers = res
        .providers
        .as_ref()
        .ok_or_else(|| infra("the fake providers are not running"))?;
    chaos.set_hub(providers.hub().clone());
    ledger.add_hook(Arc::new(world::Observer::new(
        world.clone(),
        chaos.clone(),
        work.expected
            .iter()
            .map(|e| (e.channel.provider(), e.address.clone())),
    )));

    let spec = |role: Role, argv: Vec<String>| Spec {
        role,
        slot: None,
        worker_id: None,
        argv,
        env: env.clone(),
        cwd: commands.cwd.clone(),
    };
    migrate(
        &supervisor,
        spec(Role::Migrate, commands.migrate),
        report_dir,
    )
    .await?;
    // The API reaches the database through its own link proxy when a chaos step needs one.
    let mut api = spec(Role::Api, commands.api);
    db_links::route(&world.worker.db_links, LinkOwner::Api, &mut api.env)
        .await
        .map_err(|e| infra(format!("database link proxy: {e:#}")))?;
    let api_spec_again = api.clone();
    let api_pid = supervisor
        .spawn(api)
        .await
        .map_err(|e| infra(format!("stack api could not start: {e:#}")))?;
    fakes.attributor.add_candidate(api_pid);
    let api_base = format!("http://{}", fakes.endpoints.api_addr);
    wait_healthy(&supervisor, api_pid, &api_base, Duration::from_secs(30)).await?;
    world.event(EventKind::ApiReady, None, Some(api_pid), api_base.clone());
    // `target = "api"` chaos replaces the API with the same command on the same address.
    chaos.set_api(chaos::ApiProcess {
        pid: api_pid,
        spec: api_spec_again,
        base: api_base.clone(),
    });
    for slot in 1..=scenario.stack.workers {
        world
            .start_worker(slot)
            .await
            .map_err(|e| infra(format!("stack worker could not start: {e:#}")))?;
    }
    Ok(Stack {
        supervisor,
        world,
        chaos,
        api_pid,
        api_base,
    })
}

/// The command lines of the stack's three roles: the external stack's, or this executable's
/// `stack …` subcommands for the built-in one.
struct Commands {
    api: Vec<String>,
    worker: Vec<String>,
    migrate: Vec<String>,
    cwd: Option<std::path::PathBuf>,
}

impl Commands {
    fn of(scenario: &Scenario, opts: &RunOptions) -> Commands {
        match (&scenario.stack.kind, &scenario.stack.external) {
            (StackKind::External, Some(x)) => Commands {
                api: x.api.clone(),
                worker: x.worker.clone(),
                migrate: x.migrate.clone(),
                cwd: Some(x.cwd.clone()),
            },
            _ => {
                let me = opts.self_exe.display().to_string();
                let role = |r: &str| vec![me.clone(), "stack".into(), r.into()];
                Commands {
                    api: role("api"),
                    worker: role("worker"),
                    migrate: role("migrate"),
                    cwd: None,
                }
            }
        }
    }
}

/// Runs the stack's migration to completion; anything but exit 0 within 120 s stops the run.
async fn migrate(supervisor: &Supervisor, spec: Spec, report_dir: &Path) -> anyhow::Result<()> {
    let mig = supervisor
        .spawn(spec)
        .await
        .map_err(|e| infra(format!("stack migrate could not start: {e:#}")))?;
    if !supervisor.wait_exit(mig, Duration::from_secs(120)).await {
        return Err(infra("stack migrate did not finish within 120s"));
    }
    let rec = supervisor
        .record(mig)
        .ok_or_else(|| infra("stack migrate left no process record"))?;
    if rec.exit_code != Some(0) {
        return Err(infra(format!(
            "stack migrate failed (exit {:?}, signal {:?}); see {}",
            rec.exit_code,
            rec.signal,
            report_dir.join("logs").join(&rec.log).display()
        )));
    }
    Ok(())
}

/// Waits for the API's `GET /healthz` to answer 2xx; its exit or `within` passing stops the run.
pub(super) async fn wait_healthy(
    sup: &Supervisor,
    pid: u32,
    base: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let deadline = Instant::now() + within;
    let mut last;
    loop {
        match client.get(format!("{base}/healthz")).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => last = format!("HTTP {}", r.status()),
            Err(e) if e.is_timeout() => last = "no answer within 2 s".into(),
            Err(e) if e.is_connect() => last = "connection refused".into(),
            Err(e) => last = format!("{e}"),
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
                "stack api never answered GET {base}/healthz with 200 within {}s (last try: {last})",
                within.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_never_accepted_leaves_the_progress_totals_too() {
        let text =
            "name = \"t\"\n[load]\nrecipients = 10\nchannels = [\"line\", \"sms\"]\nbatches = 2\n";
        let scenario = crate::scenario::parse(Path::new("t.toml"), text).expect("scenario");
        let mut w = Workload::of(&scenario);
        assert_eq!(w.acceptable_by.values().sum::<u64>(), 20);
        let first = w.expected[0].batch_id.clone();
        w.forget_batches([first.as_str()]);
        assert_eq!(w.batch_deliveries, 10);
        assert_eq!(w.acceptable_by.values().sum::<u64>(), 10);
        assert_eq!(
            w.acceptable_by.values().copied().collect::<Vec<_>>(),
            [5, 5]
        );
    }
}
