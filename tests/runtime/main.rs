//! The runtime's integration tests at the public API, in one test binary:
//! one link of the dependency tree instead of one per file, and the shared
//! set-up in `common` compiled once. Run one area with
//! `cargo test --test runtime signals::` (a module name as the filter).
//!
//! Each file holds the tests of one behaviour; a test found by attacking
//! the API lives with the behaviour it checks. The files:
//!
//! * `common` (`tests/common/mod.rs`): set-up: queues, stores, clocks, small runners and hooks.
//! * `fixtures`: shared set-up: the input-scripted runner, counting hooks, failing stores.
//! * `fork`: fork and restart: no step before the fork's runs again, active runs refused or cancelled first, inputs no longer recorded, the link shown, the inbox's fork.
//! * `cancel_and_hooks`: runner verdicts, external cancels racing every ending, terminal hooks.
//! * `cluster`: a cluster of processes over one store: routing, commands to other processes' shards, the key-only signal, static ownership, lease takeover and handover; worker processes with one killed by SIGKILL.
//! * `cluster_review`: the cluster attacked at its public API: bad builder input (a refused start creates nothing), client calls, every routed call dropped at each await, shutdown twice and calls after it, duplicate node ids, joining a busy cluster, churn.
//! * `children`: child workflows: results and failures reach the parent, links both ways, cancel cascades, crashes at each moment.
//! * `concurrency_keys`: per-key concurrency: a limit held under 1,000 runs over 10 keys, fairness, waiting runs listed and cancelled, bad options, a crash at each await.
//! * `cancel_lease`: a cancelled step that outlives its lease still ends its run `Cancelled`.
//! * `durability`: durable timers, run options, restarts and crashes, reconciled dead letters.
//! * `durable_paths`: cancel safety of every call that commits; dead letters racing cancels.
//! * `group_hazards`: group state against re-submission and `forget` (racing, running members).
//! * `group_reruns`: group members run again (same run id, a clean memo, after a crash, a hook still retrying, retention), notifications at the run's priority, the runtime's own errors naming the run and key.
//! * `groups`: run groups: results, counts, re-submission, concurrency, large groups, odd keys.
//! * `history`: each settlement's attempt in the run's step log, and its retention.
//! * `hook_faults`: hooks that panic, hang or outlive their lease; shutdown with a hung hook.
//! * `inbox`: commands from other processes, applied once; junk never holds up valid ones.
//! * `inbox_hostile` (unix): a directory store's inbox under links, FIFOs and floods of junk.
//! * `jobs`: typed jobs and job groups, across deploys and under concurrency.
//! * `kill9`: kill -9 of a child process running runs, or submitting a large group.
//! * `kit`: the test kit (`taquba_workflow::testing`).
//! * `limits`: options and inputs at and past their limits: refused naming them, or carried.
//! * `lost_payloads`: step records whose offloaded payload object is gone.
//! * `memo_effects`: step and run memos (odd keys included) and staged KV effects.
//! * `operator`: listing and describing runs from another process.
//! * `poison`: undecodable payloads, panicking hooks, oversized results and errors.
//! * `record_cache_review`: the claim path's cache of run records attacked: cancels racing `Continue`, timers, signals and random moments (two runtimes, a slow store), dropped cancels, re-submission, requeue/fork/restart, groups and keyed jobs.
//! * `reruns`: a run id or group member key run again after its run ended.
//! * `review_round`: fork/restart, patches and versions, and schedules attacked at the public API: bad input, drops and crashes at each await, races with the run's end, signals and memos across a fork, daylight-saving nights, pause during catch-up.
//! * `retention_replay`: step-output replay after a lease expiry, and memo retention.
//! * `review_stop38`: typed jobs' submit/join/wait attacked at the public API: joins before, during and after a job, dropped submits, keyed races, cancels, requeues, lost leases, restarts and takeovers.
//! * `review_stop39`, `review_stop40`: run ids of every shape through every call; jobs, groups and the cluster attacked at the public API (durable reads of ends, waiters, typed starts).
//! * `review_stop41_coordination`: child workflows, schedules and per-key concurrency attacked at the public API: children across crashes and cancels, schedule ticks under late rounds and crashes between them, daylight-saving nights, bad specs, keys freed by every ending, waiters across restarts.
//! * `review_stop41_code`: versioning and patches across deploys, the test kit (crashes after skipped time, far timeouts), fork from the active run (cancelling first, refusals), history bounds.
//! * `review_stop41_conformance`: the 0.13 behaviours a drop-in user relies on, each against the seed: submit and delivery fields, the status lifecycle, cancels of running and backing-off steps, KV effects, hooks, memo retention, groups and jobs.
//! * `review_stop41_inbox`: inbox command objects written as a tool in another language would (ids in lower case, in the object's name or its field).
//! * `run_ids`: run ids validated at their bounds; generated ids are ordered ULIDs.
//! * `runs`: submission (racing re-submissions), the step loop, panicking runners.
//! * `schedules`: schedules firing on virtual time, catch-up after a downtime, pause/resume, crashes mid-round, two runtimes racing.
//! * `signal_run`: signals that outlive their wait, and `signal_run`.
//! * `signals`: signal delivery, buffering, timeouts, races, oversized keys, crashes.
//! * `single_writer`: a process whose store another opened stops instead of running on.
//! * `staged_enqueues`: enqueues a caller stages cannot forge the runtime's jobs.
//! * `storage_outages`: storage blips and outages held for a whole call or window.
//! * `stored_formats`: keys, paths and headers as a 0.13 store has them.
//! * `waits`: `wait`, `wait_timeout`, job joins and group results, woken by commits.
//!
//! The macro suites (which register items through `inventory`, one registry
//! per binary), the panic-counting fault suite and the S3/webhook suites
//! (behind features) keep their own binaries.

#[path = "../common/mod.rs"]
mod common;

mod cancel_and_hooks;
mod cancel_lease;
mod children;
mod cluster;
mod cluster_review;
mod concurrency_keys;
mod durability;
mod durable_job_reads;
mod durable_paths;
mod fixtures;
mod fork;
mod group_hazards;
mod group_reruns;
mod groups;
mod history;
mod hook_faults;
mod inbox;
#[cfg(unix)]
mod inbox_hostile;
mod jobs;
mod kill9;
mod kit;
mod limits;
mod lost_payloads;
mod memo_effects;
mod operator;
mod perf_review;
mod poison;
mod record_cache_review;
mod reruns;
mod retention_replay;
mod review_round;
mod review_stop37;
mod review_stop38;
mod review_stop39;
mod review_stop40;
mod review_stop41_code;
mod review_stop41_conformance;
mod review_stop41_coordination;
mod review_stop41_inbox;
mod run_ids;
mod runs;
mod schedules;
mod seed_conformance;
mod signal_run;
mod signals;
mod single_writer;
mod staged_enqueues;
mod storage_outages;
mod stored_formats;
mod waits;
