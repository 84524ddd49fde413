//! The shared suites of `workq-conformance` on the in-memory queue: every rule of the flow
//! control suite (alone and, with feature `tokio`, batched), and every rule of the
//! behaviour suite on `WorkQueue`, and (feature `tokio`) every rule of the `Workers` suite on
//! `WorkQueue` alone and seen as a backend whose steps `Workers` batch, and (feature `otel`)
//! every rule of the trace link suite. Each backend runs the same rules on its server in its
//! own tests.
//!
//! The file's name is unique in the workspace on purpose: `cargo xtask test --quick` selects
//! integration tests by name across packages, and a name a backend's tests also use would
//! make it build theirs, which start servers.

/// Instantiates every behaviour rule in memory.
macro_rules! behaviour_suite {
    ($($rule:ident),* $(,)?) => {
        mod behaviour {
            mod in_memory {
                use workq_conformance::behaviour::{MemoryFactory, rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        rules::$rule(&MemoryFactory).await;
                    }
                )*
            }
        }
    };
}

workq_conformance::for_each_rule!(behaviour_suite);

/// Instantiates every `Workers` rule in memory, alone and through batched steps.
#[cfg(feature = "tokio")]
macro_rules! workers_suite {
    ($($rule:ident),* $(,)?) => {
        mod workers {
            mod in_memory {
                use workq_conformance::workers::{Memory, rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        rules::$rule(&Memory).await;
                    }
                )*
            }
            /// The in-memory queue through `Workers`' batched steps.
            mod in_memory_batched {
                use workq_conformance::workers::{BatchedMemory, rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        rules::$rule(&BatchedMemory).await;
                    }
                )*
            }
        }
    };
}

#[cfg(feature = "tokio")]
workq_conformance::for_each_workers_rule!(workers_suite);

/// Instantiates every flow control rule in memory, and (feature `tokio`) seen as a backend
/// whose steps `Workers` batch.
macro_rules! flow_suite {
    ($($rule:ident),* $(,)?) => {
        mod flow {
            mod in_memory {
                use workq_conformance::flow::{Memory, rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        rules::$rule(&Memory).await;
                    }
                )*
            }
            #[cfg(feature = "tokio")]
            mod in_memory_batched {
                use workq_conformance::flow::{BatchedMemory, rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        rules::$rule(&BatchedMemory).await;
                    }
                )*
            }
        }
    };
}

workq_conformance::for_each_flow_rule!(flow_suite);

/// Instantiates the flow control rules that drive a `Workers` pool, in memory alone and
/// through batched steps.
#[cfg(feature = "tokio")]
macro_rules! flow_workers_suite {
    ($($rule:ident),* $(,)?) => {
        mod flow_workers {
            mod in_memory {
                use workq_conformance::flow::{Memory, workers_rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        workers_rules::$rule(&Memory).await;
                    }
                )*
            }
            mod in_memory_batched {
                use workq_conformance::flow::{BatchedMemory, workers_rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        workers_rules::$rule(&BatchedMemory).await;
                    }
                )*
            }
        }
    };
}

#[cfg(feature = "tokio")]
workq_conformance::for_each_flow_workers_rule!(flow_workers_suite);

/// Instantiates every trace link rule in memory (feature `otel`).
#[cfg(feature = "otel")]
macro_rules! trace_suite {
    ($($rule:ident),* $(,)?) => {
        mod trace {
            mod in_memory {
                use workq_conformance::trace::{Memory, rules};
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $rule() {
                        rules::$rule(&Memory).await;
                    }
                )*
            }
        }
    };
}

#[cfg(feature = "otel")]
workq_conformance::for_each_trace_rule!(trace_suite);
