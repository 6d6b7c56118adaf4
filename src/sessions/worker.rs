//! The LLM worker: one context, every session's turn in one continuous batch.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use voxline_core::Priority;
use voxline_llm::batch::{BatchEngine, StepEvent};
use voxline_llm::{LlmError, LlmModel};

use super::{nanos, Cmd, Reply, SessionEvent, Shared};

/// A turn the LLM worker is answering.
struct Answering {
    turn: u32,
    reply: Reply,
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// The LLM worker: loads the model, then serves commands and steps the
/// batch while any session is answering.
pub(super) fn llm_worker(
    shared: &Shared,
    config: voxline_llm::LlmConfig,
    max_sessions: usize,
    rx: &Receiver<Cmd>,
    ready: &Sender<Result<(), LlmError>>,
) {
    let model = match LlmModel::load(config) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut engine = match BatchEngine::new(&model, max_sessions) {
        Ok(e) => e,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut answering: Vec<Option<Answering>> = (0..max_sessions).map(|_| None).collect();
    let mut queued: Vec<VecDeque<Queued>> = (0..max_sessions).map(|_| VecDeque::new()).collect();
    loop {
        let cmd = if engine.busy() == 0 {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            rx.try_recv().ok()
        };
        match cmd {
            Some(Cmd::Shutdown) => {
                // sessions leaving now hear that their slot is free
                for cmd in rx.try_iter() {
                    if let Cmd::Leave { .. } = cmd {
                        handle(&mut engine, &mut answering, &mut queued, shared, cmd);
                    }
                }
                return;
            }
            Some(cmd) => handle(&mut engine, &mut answering, &mut queued, shared, cmd),
            None => {
                step(&mut engine, &mut answering, shared);
                // a session whose answer ended starts its next turn
                for slot in 0..max_sessions {
                    if answering[slot].is_none() {
                        if let Some(q) = queued[slot].pop_front() {
                            begin(&mut engine, &mut answering, slot, q);
                        }
                    }
                }
            }
        }
    }
}

/// A turn waiting for its session's previous answer to end.
struct Queued {
    turn: u32,
    user: String,
    reply: Reply,
    sent: Instant,
}

fn handle(
    engine: &mut BatchEngine<'_>,
    answering: &mut [Option<Answering>],
    queued: &mut [VecDeque<Queued>],
    shared: &Shared,
    cmd: Cmd,
) {
    match cmd {
        Cmd::Start {
            slot,
            turn,
            user,
            reply,
        } => {
            let q = Queued {
                turn,
                user,
                reply,
                sent: Instant::now(),
            };
            // One answer at a time per conversation, in order (as the
            // single-conversation pipeline does): a turn spoken while the
            // previous answer streams waits for it.
            if answering[slot].is_some() || !queued[slot].is_empty() {
                queued[slot].push_back(q);
            } else {
                begin(engine, answering, slot, q);
            }
        }
        Cmd::Shutdown => {}
        Cmd::Leave { slot, done } => {
            answering[slot] = None;
            queued[slot].clear();
            // A sequence that cannot be cleared is not given to anyone else.
            if engine.reset(slot).is_ok() {
                if let Some(s) = shared
                    .slots
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_mut(slot)
                {
                    *s = false;
                }
            }
            let _ = done.send(());
        }
    }
}

/// Starts `q`'s answer in the running batch.
fn begin(
    engine: &mut BatchEngine<'_>,
    answering: &mut [Option<Answering>],
    slot: usize,
    q: Queued,
) {
    if let Err(e) = engine.start(slot, &q.user) {
        q.reply.send(SessionEvent::TurnError {
            turn: q.turn,
            message: e.to_string(),
        });
        return;
    }
    answering[slot] = Some(Answering {
        turn: q.turn,
        reply: q.reply,
        sent: q.sent,
        first: None,
        last: None,
    });
}

fn step(engine: &mut BatchEngine<'_>, answering: &mut [Option<Answering>], shared: &Shared) {
    // A step holding some turn's first token is the end of that turn's
    // critical path (its transcript is done; ~100 ms remain): it goes before
    // another conversation's transcription starts (~1 s), as that
    // transcription's own turn would (shortest remaining work first; with
    // the STT ahead, four users on two cores waited 35 s for first tokens).
    let priority = if engine.prefilling() {
        Priority::Committed
    } else {
        Priority::Streaming
    };
    let lease = shared.lease.acquire(priority);
    let meter = shared.meter.enter(shared.threads);
    let prefilled_before = engine.prefilled_tokens();
    let began = Instant::now();
    let result = engine.step();
    let busy = began.elapsed();
    let prefilled = engine.prefilled_tokens() - prefilled_before;
    drop(meter);
    drop(lease);
    let now = Instant::now();
    let c = &shared.counters;
    c.llm_busy_ns.fetch_add(nanos(busy), Ordering::Relaxed);
    c.llm_steps.fetch_add(1, Ordering::Relaxed);
    if prefilled > 0 {
        c.prefill_tokens.fetch_add(prefilled, Ordering::Relaxed);
        c.prefill_busy_ns.fetch_add(nanos(busy), Ordering::Relaxed);
    }
    let events = match result {
        Ok(ev) => ev,
        Err(e) => {
            // the engine cancelled every turn in the batch
            for a in answering.iter_mut().filter_map(Option::take) {
                a.reply.send(SessionEvent::TurnError {
                    turn: a.turn,
                    message: e.to_string(),
                });
            }
            return;
        }
    };
    for ev in events {
        match ev {
            StepEvent::Token { session, piece } => {
                c.tokens.fetch_add(1, Ordering::Relaxed);
                if let Some(a) = answering[session].as_mut() {
                    a.first.get_or_insert(now);
                    a.last = Some(now);
                    a.reply.send(SessionEvent::Token {
                        turn: a.turn,
                        piece,
                        at: now,
                    });
                }
            }
            StepEvent::Done {
                session,
                text,
                n_sampled,
                stop,
            } => {
                if let Some(a) = answering[session].take() {
                    a.reply.send(SessionEvent::TurnDone {
                        turn: a.turn,
                        text,
                        tokens: n_sampled,
                        stop,
                        first_token: a.first.map(|f| f - a.sent),
                        decode: a.first.zip(a.last).map(|(f, l)| l - f),
                    });
                }
            }
        }
    }
}
