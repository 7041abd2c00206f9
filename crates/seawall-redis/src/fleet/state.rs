//! The state every service of one [`FleetLimitLayer`](super::FleetLimitLayer) shares: the
//! settings, the loaded scripts, the in-process share and the holds this replica keeps alive;
//! and the admission loop that uses them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use seawall_core::{LlmError, PartEstimate};
use seawall_gate::{Cost, Limit, RejectReason};
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::error::FleetRejection;
use super::keys::{Limits, Target};
use super::local::{Local, LocalAnswer};
use super::permit::FleetPermit;
use crate::clock::Clock;
use crate::{OnUnavailable, SharedRedis};

/// The name the fleet's calls go under in the shared connection's logs and metric.
const STORE: &str = "fleet";

/// The pauses between the attempts of a settlement: four attempts within about a second.
const SETTLE_RETRIES: [Duration; 4] = [
    Duration::from_millis(20),
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::ZERO,
];

/// The settings a layer is built with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) limits: Limits,
    pub(crate) on_unavailable: OnUnavailable,
    pub(crate) max_wait: Duration,
    pub(crate) max_pause: Duration,
    pub(crate) lease: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) permit_poll: Duration,
    pub(crate) parts: PartEstimate,
    pub(crate) max_keys: usize,
}

/// The scripts, loaded once per server (EVALSHA, then SCRIPT LOAD on `NOSCRIPT`).
struct Scripts {
    acquire: redis::Script,
    settle: redis::Script,
    pause: redis::Script,
    renew: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            acquire: redis::Script::new(super::ACQUIRE),
            settle: redis::Script::new(super::SETTLE),
            pause: redis::Script::new(super::PAUSE),
            renew: redis::Script::new(super::RENEW),
        }
    }
}

pub(crate) struct Fleet {
    pub(crate) redis: SharedRedis,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) settings: Settings,
    pub(crate) local: Local,
    scripts: Scripts,
    /// This replica's live holds, by holds key: renewed until they end.
    live: Mutex<HashMap<Arc<str>, HashSet<Arc<str>>>>,
    renewing: AtomicBool,
    /// Hold ids are `<replica>:<layer>:<n>`: unique across the fleet as long as replica
    /// names are, and across the layers of one process.
    id_prefix: String,
    next_id: AtomicU64,
    /// The runtime the layer was built in, for the settlements of hooks that run outside one.
    runtime: Option<Handle>,
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("redis", &self.redis)
            .field("clock", &self.clock)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// What one admission attempt answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// Admitted by the fleet: this hold is in Redis.
    Admitted(Arc<str>),
    /// Admitted by the in-process share, while Redis is unreachable (fail open).
    Local,
    Wait(Duration, RejectReason),
    Never,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A limit as the scripts take it: (per minute, burst), or (-1, 0) for none.
fn limit_args(limit: Option<Limit>) -> (i64, i64) {
    match limit {
        Some(l) => (
            i64::try_from(l.units_per_minute()).unwrap_or(i64::MAX),
            i64::try_from(l.burst()).unwrap_or(i64::MAX),
        ),
        None => (-1, 0),
    }
}

static LAYERS: AtomicU64 = AtomicU64::new(0);

impl Fleet {
    pub(crate) fn new(redis: SharedRedis, clock: Arc<dyn Clock>, settings: Settings) -> Self {
        let layer = LAYERS.fetch_add(1, Ordering::Relaxed);
        Fleet {
            id_prefix: format!("{}:{layer}", redis.replica()),
            local: Local::new(settings.max_keys, clock.now_ms()),
            redis,
            clock,
            settings,
            scripts: Scripts::new(),
            live: Mutex::new(HashMap::new()),
            renewing: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            runtime: Handle::try_current().ok(),
        }
    }

    fn live(&self) -> MutexGuard<'_, HashMap<Arc<str>, HashSet<Arc<str>>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn target(&self, key: Option<&str>) -> Target {
        self.settings.limits.target(&self.redis, key)
    }

    /// Runs `fut` in the background: on the current runtime, else on the layer's. Without
    /// either it is dropped, and what it would have done is left to the leases.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if let Ok(h) = Handle::try_current() {
            h.spawn(fut);
        } else if let Some(h) = &self.runtime {
            h.spawn(fut);
        }
    }

    /// Admits a call under its key's fleet-wide limits, waiting (within the maximum wait) when
    /// the fleet says when it could go.
    ///
    /// Cancel-safe: dropping it during a wait leaves nothing behind; dropping it while the
    /// acquire script is in flight queues a cancellation of its hold id, as a timeout does.
    pub(crate) async fn admit(
        self: Arc<Self>,
        target: Arc<Target>,
        cost: Cost,
    ) -> Result<FleetPermit, LlmError> {
        let start = Instant::now();
        let max_wait = self.settings.max_wait;
        loop {
            let now = self.clock.now_ms();
            // A pause this replica knows of needs no round trip.
            let answer = match self.local.pause_left(&target, now) {
                Some(left) => Answer::Wait(left, RejectReason::KeyPaused),
                None => self.try_once(&target, cost, now).await?,
            };
            match answer {
                Answer::Admitted(id) => {
                    self.track(&target, &id);
                    return Ok(FleetPermit::fleet(self, target, cost, id));
                }
                Answer::Local => return Ok(FleetPermit::local(self, target, cost)),
                Answer::Never => {
                    return Err(FleetRejection::error(
                        RejectReason::ZeroRate,
                        target.name.clone(),
                        start.elapsed(),
                        max_wait,
                        None,
                    ));
                }
                Answer::Wait(d, reason) => {
                    let waited = start.elapsed();
                    if waited.saturating_add(d) > max_wait {
                        let hint = (reason != RejectReason::WaitTimeout).then_some(d);
                        return Err(FleetRejection::error(
                            reason,
                            target.name.clone(),
                            waited,
                            max_wait,
                            hint,
                        ));
                    }
                    tokio::time::sleep(d).await;
                }
            }
        }
    }

    /// One attempt: the acquire script, or the failure policy when Redis does not answer.
    async fn try_once(
        self: &Arc<Self>,
        target: &Arc<Target>,
        cost: Cost,
        now: u64,
    ) -> Result<Answer, LlmError> {
        // A fresh id per attempt: a cancellation queued for an earlier attempt can never end
        // this one's hold.
        let id: Arc<str> = Arc::from(format!(
            "{}:{}",
            self.id_prefix,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        ));
        let reached = if self.redis.skip_while_degraded() {
            None
        } else {
            // If this future is dropped mid-call, or the call times out after the script ran,
            // the hold may exist: the guard queues its cancellation (a no-op when it does not).
            let mut guard = CancelOnDrop {
                fleet: self,
                target,
                id: &id,
                cost,
                armed: true,
            };
            let answer = self.acquire(target, &id, cost, now).await.ok();
            guard.armed = answer.is_none();
            answer
        };
        match reached {
            Some(answer) => Ok(answer),
            None => match self.settings.on_unavailable {
                OnUnavailable::FailClosed => Err(OnUnavailable::refusal("rate limit")),
                OnUnavailable::FailOpen { replicas } => {
                    Ok(match self.local.try_admit(target, cost, now, replicas) {
                        LocalAnswer::Admitted => Answer::Local,
                        LocalAnswer::Wait(d) => Answer::Wait(d, RejectReason::RateLimited),
                        LocalAnswer::Busy => {
                            Answer::Wait(self.settings.permit_poll, RejectReason::WaitTimeout)
                        }
                        LocalAnswer::Never => Answer::Never,
                    })
                }
            },
        }
    }

    /// The acquire script (see `scripts/fleet_acquire.lua`).
    async fn acquire(
        &self,
        target: &Target,
        id: &Arc<str>,
        cost: Cost,
        now: u64,
    ) -> Result<Answer, crate::Unavailable> {
        let (rpm, rburst) = limit_args(target.rates.requests());
        let (tpm, tburst) = limit_args(target.rates.tokens());
        let permits = target.permits.map_or(-1, i64::from);
        let mut inv = self.scripts.acquire.prepare_invoke();
        inv.key(&target.buckets)
            .key(&*target.holds)
            .key(&target.pause)
            .arg(now)
            .arg(&**id)
            .arg(ms(self.settings.lease))
            .arg(rpm)
            .arg(rburst)
            .arg(tpm)
            .arg(tburst)
            .arg(cost.tokens())
            .arg(permits)
            .arg(ms(self.settings.permit_poll).max(1));
        let (code, wait, why): (i64, u64, String) = self
            .redis
            .run(STORE, |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let wait = Duration::from_millis(wait);
        Ok(match (code, why.as_str()) {
            (1, _) => Answer::Admitted(id.clone()),
            (0, "paused") => {
                // Learned: this replica stops asking until it ends.
                self.local.pause(target, now, now.saturating_add(ms(wait)));
                Answer::Wait(wait, RejectReason::KeyPaused)
            }
            (0, "permits") => Answer::Wait(wait, RejectReason::WaitTimeout),
            (0, _) => Answer::Wait(wait, RejectReason::RateLimited),
            _ => Answer::Never,
        })
    }

    /// Ends a fleet hold: settles its tokens against `used` (`cancel`: the call never went,
    /// so its request and every token go back). In the background, and at most once (the
    /// script acts only while the hold exists), which makes it safe to try again: a call that
    /// timed out is sent again after [`SETTLE_RETRIES`], so a settlement survives a slow
    /// moment of the server (or a script cache emptied by a restart, whose `NOSCRIPT` answer
    /// came too late for the first attempt).
    pub(crate) fn settle(
        self: &Arc<Self>,
        target: Arc<Target>,
        id: Arc<str>,
        cost: Cost,
        used: u64,
        cancel: bool,
    ) {
        self.untrack(&target, &id);
        let fleet = self.clone();
        self.spawn(async move {
            for delay in SETTLE_RETRIES {
                if fleet
                    .settle_now(&target, &id, cost, used, cancel)
                    .await
                    .is_ok()
                {
                    return;
                }
                tokio::time::sleep(delay).await;
            }
            tracing::debug!(target: "seawall::redis", key = target.name.as_deref(),
                "fleet limit: a settlement was lost; the hold ends with its lease");
        });
    }

    /// The settle script (see `scripts/fleet_settle.lua`); `Ok(true)` when the hold was there.
    pub(crate) async fn settle_now(
        &self,
        target: &Target,
        id: &str,
        cost: Cost,
        used: u64,
        cancel: bool,
    ) -> Result<bool, crate::Unavailable> {
        let (rpm, rburst) = limit_args(target.rates.requests());
        let (tpm, tburst) = limit_args(target.rates.tokens());
        let mut inv = self.scripts.settle.prepare_invoke();
        inv.key(&target.buckets)
            .key(&*target.holds)
            .arg(self.clock.now_ms())
            .arg(id)
            .arg(rpm)
            .arg(rburst)
            .arg(tpm)
            .arg(tburst)
            .arg(cost.tokens())
            .arg(used)
            .arg(if cancel { "cancel" } else { "settle" });
        let done: i64 = self
            .redis
            .run(STORE, |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok(done == 1)
    }

    /// Pauses the key fleet-wide for `d` (capped at the maximum pause): at once for this
    /// replica, and for the others through one script call in the background.
    pub(crate) fn pause(self: &Arc<Self>, target: &Arc<Target>, d: Duration) {
        let d = d.min(self.settings.max_pause);
        if d.is_zero() {
            return;
        }
        // Whole milliseconds, rounded up: never resume before the upstream said.
        let pause_ms = u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        let now = self.clock.now_ms();
        tracing::debug!(
            target: "seawall::redis",
            key = target.name.as_deref(),
            pause_ms,
            "fleet limit: upstream rate limit, pausing this key fleet-wide"
        );
        self.local.pause(target, now, now.saturating_add(pause_ms));
        let fleet = self.clone();
        let target = target.clone();
        self.spawn(async move {
            let mut inv = fleet.scripts.pause.prepare_invoke();
            inv.key(&target.pause).arg(now).arg(pause_ms);
            let _ = fleet
                .redis
                .run(STORE, |mut c| async move {
                    inv.invoke_async::<i64>(&mut c).await
                })
                .await;
        });
    }

    fn track(self: &Arc<Self>, target: &Target, id: &Arc<str>) {
        self.live()
            .entry(target.holds.clone())
            .or_default()
            .insert(id.clone());
        if self.settings.renew_every.is_some() && !self.renewing.swap(true, Ordering::AcqRel) {
            let weak = Arc::downgrade(self);
            self.spawn(renew_loop(weak));
        }
    }

    fn untrack(&self, target: &Target, id: &str) {
        let mut live = self.live();
        if let Some(ids) = live.get_mut(&target.holds) {
            ids.remove(id);
            if ids.is_empty() {
                live.remove(&target.holds);
            }
        }
    }

    /// Renews the leases of every live hold of this replica: one script call per key.
    pub(crate) async fn renew(&self) {
        let batches: Vec<(Arc<str>, Vec<Arc<str>>)> = self
            .live()
            .iter()
            .map(|(k, ids)| (k.clone(), ids.iter().cloned().collect()))
            .collect();
        for (holds, ids) in batches {
            let mut inv = self.scripts.renew.prepare_invoke();
            inv.key(&*holds)
                .arg(self.clock.now_ms())
                .arg(ms(self.settings.lease));
            for id in &ids {
                inv.arg(&**id);
            }
            let _ = self
                .redis
                .run(STORE, |mut c| async move {
                    inv.invoke_async::<i64>(&mut c).await
                })
                .await;
        }
    }
}

/// Renews the layer's leases every `renew_every` while the layer (or a call it admitted)
/// lives; it holds the state weakly, so it ends with it.
async fn renew_loop(weak: Weak<Fleet>) {
    let Some(every) = weak.upgrade().and_then(|f| f.settings.renew_every) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(fleet) = weak.upgrade() else {
            return;
        };
        fleet.renew().await;
    }
}

/// Queues the cancellation of a hold whose acquire may have run without its answer reaching
/// us (a timeout, a lost connection, a dropped future).
struct CancelOnDrop<'a> {
    fleet: &'a Arc<Fleet>,
    target: &'a Arc<Target>,
    id: &'a Arc<str>,
    cost: Cost,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.fleet
                .settle(self.target.clone(), self.id.clone(), self.cost, 0, true);
        }
    }
}
