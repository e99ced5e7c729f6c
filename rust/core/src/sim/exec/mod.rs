//! Execution time of a batch stage. The simulator asks an [`ExecModel`] for each
//! (batch, stage). Two models are evaluated in Rust: [`LinearModel`] (a few per-token
//! coefficients) and [`OpModel`] (a sum of per-operation costs, each a roofline or an
//! interpolated table, compiled in Python from a model and a GPU or from profiles). The
//! Python layer can supply any other model (the slow path) through the same trait.

mod linear;
mod ops;

pub use linear::LinearModel;
pub use ops::{Cost, Feature, Features, Op, OpModel, Roofline, Scope, Table};

use super::batch::BatchShape;
use crate::Result;

/// Seconds one batch stage takes: `total_s` (what the clock advances) includes the CPU
/// overheads on top of `model_s`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageTime {
    pub total_s: f64,
    pub model_s: f64,
}

pub trait ExecModel: Send {
    /// Time of `shape` on pipeline stage `stage` of `num_stages` (each stage holds an equal
    /// share of the layers).
    fn stage_time(&mut self, shape: &BatchShape, stage: u32, num_stages: u32) -> Result<StageTime>;
}

/// Stage times of many batch shapes: what the simulator would charge for each.
pub fn evaluate_many(
    model: &mut dyn ExecModel,
    shapes: &[BatchShape],
    stage: u32,
    num_stages: u32,
) -> Result<Vec<StageTime>> {
    if stage >= num_stages {
        return Err(crate::Error::config(
            "stage",
            stage,
            format!("must be below num_stages = {num_stages}"),
        ));
    }
    shapes
        .iter()
        .map(|shape| model.stage_time(shape, stage, num_stages))
        .collect()
}

/// Asks `inner` `times` times per batch stage and answers with the last: same answers,
/// `times` x the model's cost. A benchmark knob: the difference between runs with 1 and 2
/// is exactly what the model costs inside the event loop (the schedule is unchanged).
pub struct Repeated<'a> {
    pub inner: &'a mut dyn ExecModel,
    pub times: u32,
}

impl ExecModel for Repeated<'_> {
    fn stage_time(&mut self, shape: &BatchShape, stage: u32, num_stages: u32) -> Result<StageTime> {
        let mut time = self.inner.stage_time(shape, stage, num_stages)?;
        for _ in 1..self.times {
            time = self
                .inner
                .stage_time(std::hint::black_box(shape), stage, num_stages)?;
        }
        Ok(time)
    }
}
