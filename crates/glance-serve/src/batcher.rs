//! The scheduling worker: one thread owns every running sequence, of any strategy, and loops
//! `admit new jobs → Engine::step (≤ one prefill chunk, then one shared target pass) → answer
//! the finished ones`. Jobs arrive already prepared (template, tokens, images encoded) by the
//! request's own blocking task, so the vision tower never stalls the running decodes.

use crate::chat::{conclude, message, Msg};
use crate::metrics::Metrics;
use crate::slots::Slot;
use glance_engine::{Engine, Event, Flow, Prepared, Sequence};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// A prepared request for the batch: choice `index` of its HTTP request, whose choices share
/// one slot (freed when the last ends).
pub struct Job {
    pub prepared: Prepared,
    pub index: usize,
    pub tx: UnboundedSender<Msg>,
    pub arrived: Instant,
    pub slot: Arc<Slot>,
}

/// The handle of the worker thread; the thread ends when the handle is dropped.
pub struct Batcher {
    jobs: Sender<Job>,
}

/// What the worker keeps beside each sequence.
struct Meta {
    index: usize,
    tx: UnboundedSender<Msg>,
    arrived: Instant,
    slot: Arc<Slot>,
}

impl Batcher {
    /// Starts the worker; `prefill_chunk` caps the prompt rows run between two decode steps.
    pub fn start(
        engine: Arc<Engine>,
        metrics: Arc<Metrics>,
        prefill_chunk: usize,
    ) -> std::io::Result<Self> {
        let (jobs, rx) = channel();
        std::thread::Builder::new()
            .name("glance-batch".into())
            .spawn(move || run(&engine, &metrics, &rx, prefill_chunk))?;
        Ok(Self { jobs })
    }

    /// Hands `job` to the worker (or answers it with an error if the worker is gone).
    pub fn submit(&self, job: Job) {
        if let Err(e) = self.jobs.send(job) {
            let job = e.0;
            drop(job.slot);
            let err = crate::error::ApiError::internal("the batching worker has stopped");
            let _ = job.tx.send(Msg::Failed(err));
        }
    }
}

fn run(engine: &Engine, metrics: &Metrics, jobs: &Receiver<Job>, chunk: usize) {
    let mut seqs: Vec<Sequence<'_>> = Vec::new();
    let mut metas: Vec<Meta> = Vec::new();
    loop {
        if seqs.is_empty() {
            // Idle: sleep until a job arrives (or every sender is gone).
            match jobs.recv() {
                Ok(job) => admit(engine, job, &mut seqs, &mut metas),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            admit(engine, job, &mut seqs, &mut metas);
        }
        let decoding: Vec<&'static str> = seqs
            .iter()
            .filter(|s| s.is_decoding())
            .map(|s| s.strategy())
            .collect();
        engine.step(&mut seqs, chunk);
        if !decoding.is_empty() {
            metrics.batch_step(&decoding);
        }
        for j in (0..seqs.len()).rev() {
            if seqs[j].is_done() {
                let seq = seqs.remove(j);
                let meta = metas.remove(j);
                let first = seq.first_token_at();
                let end = conclude(
                    metrics,
                    engine.response(seq),
                    meta.index,
                    meta.arrived,
                    first,
                );
                // The slot is free before the answer goes out.
                drop(meta.slot);
                if let Some(end) = end {
                    let _ = meta.tx.send(end);
                }
            }
        }
    }
}

fn admit<'e>(engine: &'e Engine, job: Job, seqs: &mut Vec<Sequence<'e>>, metas: &mut Vec<Meta>) {
    let (tx, index) = (job.tx.clone(), job.index);
    let sink = Box::new(move |event: Event| match tx.send(message(index, event)) {
        Ok(()) => Flow::Continue,
        Err(_) => Flow::Cancel,
    });
    match engine.sequence(job.prepared, sink) {
        Ok(seq) => {
            seqs.push(seq);
            metas.push(Meta {
                index: job.index,
                tx: job.tx,
                arrived: job.arrived,
                slot: job.slot,
            });
        }
        Err(e) => {
            drop(job.slot);
            let _ = job.tx.send(Msg::Failed(e.into()));
        }
    }
}
