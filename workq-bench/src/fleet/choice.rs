//! The W7 shapes chosen on the command line ([`Choice`]), which the run hands every workload.

use crate::report::Shape;

/// The shapes chosen on the command line (`--processes`, `--workers`, `--handler-ms`); an
/// empty list takes the workload's default.
#[derive(Debug, Clone, Default)]
pub(crate) struct Choice {
    pub(crate) processes: Vec<u32>,
    pub(crate) workers: Vec<u32>,
    pub(crate) handler_ms: Vec<u32>,
}

impl Choice {
    /// Every combination, with these defaults for what was not chosen.
    pub(super) fn shapes(
        &self,
        processes: &[u32],
        workers: &[u32],
        handler_ms: &[u32],
    ) -> Vec<Shape> {
        let pick = |chosen: &[u32], default: &[u32]| {
            if chosen.is_empty() {
                default.to_vec()
            } else {
                chosen.to_vec()
            }
        };
        let mut shapes = Vec::new();
        for handler_ms in pick(&self.handler_ms, handler_ms) {
            for processes in pick(&self.processes, processes) {
                for workers in pick(&self.workers, workers) {
                    shapes.push(Shape {
                        processes,
                        workers,
                        handler_ms,
                    });
                }
            }
        }
        shapes
    }
}
