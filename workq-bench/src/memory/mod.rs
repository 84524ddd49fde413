//! The workloads on the in-memory queue, one module each; each module's documentation says
//! what it measures, beside which references, and its caveats.

pub(crate) mod controller_runtime;
pub(crate) mod p1_priority;
pub(crate) mod w1_fifo;
pub(crate) mod w2_contended;
pub(crate) mod w3_dedup;
pub(crate) mod w3_fixed_rate;
pub(crate) mod w4_delay;
pub(crate) mod w5_retry;
pub(crate) mod w6_memory;
