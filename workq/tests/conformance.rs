//! The shared suites of `workq-conformance` on the in-memory queue: every rule of the
//! behaviour suite on `WorkQueue`, and (feature `tokio`) every rule of the `Workers` suite on
//! `WorkQueue` alone and seen as a backend whose steps `Workers` batch. Each backend runs the
//! same rules on its server in its own tests.
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
