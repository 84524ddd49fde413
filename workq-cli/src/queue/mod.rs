//! `wq queue ...`: the operator's commands for the queues of any backend, through the
//! operator contract (`workq::admin::Admin`). The URL's scheme picks the backend:
//! `redis://`, `rediss://`, `redis+unix://` or `postgres://`. `wq redis ...` and
//! `wq postgres ...` are the same commands, reading their own variable first.
//!
//! The server comes from `--url` or, better for a URL with a password (a command line is
//! visible to every user of the machine), from `$WQ_URL`. No command creates a queue: a
//! name the server does not know is an error.
//!
//! What loses work or stops every worker (`shutdown`, `remove`, `dead-letters purge`,
//! `requeue-all` and `delete`) says what it will do and asks on a terminal; without one it
//! wants `--yes`. `--dry-run` says what any action would do and does nothing. Every text
//! from the server is printed with its control characters escaped ([`escape`]).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::process::ExitCode;

use workq::admin::{
    Action, Admin, AdminError, End, ItemState, PageQuery, act, redact_url, redact_urls_in,
};

mod open;
pub(crate) mod print;

pub(crate) use open::{Alias, admin_for};
use print::escape;
use workq_dashboard::text;

/// Options of `wq queue` (and of its aliases).
#[derive(Debug, clap::Args)]
pub(crate) struct QueueArgs {
    /// The server: `redis://[user:password@]host:port[/db]` (rediss:// for TLS,
    /// redis+unix:///path for a socket) or `postgres://user[:password]@host:port/database`.
    /// Default $WQ_URL (`wq redis`: $WQ_REDIS_URL first; `wq postgres`: $WQ_POSTGRES_URL
    /// first); put a URL with a password there, not on the command line, where every user
    /// of the machine can read it.
    #[arg(long, global = true)]
    url: Option<String>,
    /// The prefix of the queues' keys on Redis (default wq).
    #[arg(long, global = true)]
    prefix: Option<String>,
    /// Acts without asking (what `shutdown`, `remove` and the bulk dead-letter commands
    /// need without a terminal).
    #[arg(long, short = 'y', global = true)]
    yes: bool,
    /// Says what the action would do, and does nothing.
    #[arg(long, global = true)]
    dry_run: bool,
    #[command(subcommand)]
    command: QueueCommand,
}

/// The commands; each one's name for messages (`wq queue stats`, `wq redis dead-letters`) is
/// its `&'static str`.
#[derive(Debug, clap::Subcommand, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
enum QueueCommand {
    /// Lists every queue: depth, delayed, in flight, dead letters, shut down or paused.
    #[command(alias = "queues")]
    List,
    /// Shows a queue: depth, delayed, in flight with lease ages, tracked failures, its
    /// groups and limits (with flow control) and its periodic schedules.
    Stats {
        queue: String,
        /// How many leases, failure counts and dead letters to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// How many groups to list (the ones with the most ready items).
        #[arg(long, value_name = "N", default_value_t = 10)]
        groups: usize,
        /// The figures as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lists one page of a queue's items in one state, one JSON object a line.
    Items {
        queue: String,
        /// ready, delayed, in-flight, failing or dead.
        #[arg(long, value_parser = state_of)]
        state: ItemState,
        /// From which end of the state's order: first or last.
        #[arg(long, value_parser = end_of, default_value = "first")]
        from: End,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Only items whose text (dead letters: or error) holds this, in any case.
        #[arg(long)]
        search: Option<String>,
        /// Where to start: the cursor the previous page gave as `next`.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Shows everything known of one item (its stored JSON text, e.g. '"default/web-0"'),
    /// as JSON.
    Item { queue: String, item: String },
    /// Pauses the queue for every process: gets hand out nothing, adds are kept.
    Pause { queue: String },
    /// Ends a `shutdown` or a `pause`, whichever is on.
    Resume { queue: String },
    /// Shuts the queue down for every process: adds are ignored, queued items are still
    /// handed out, then every worker's get returns None. Undo with `resume`. Asks first.
    Shutdown { queue: String },
    /// Queues a delayed or failing item now (its failure count stays).
    Retry { queue: String, item: String },
    /// Takes an item out of the queue (a lease out stays with its holder) and clears its
    /// failure count. Asks first.
    Remove { queue: String, item: String },
    /// Clears an item's failure count.
    Forget { queue: String, item: String },
    /// Lists, requeues, deletes or purges the queue's dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
    /// Lists the queue's periodic schedules, or pauses or resumes one for every process.
    #[command(subcommand)]
    Schedules(SchedulesCommand),
    /// Redis: finds the queues made by a version that kept no index of queue names, scanning
    /// the whole keyspace at once (the listings otherwise do it a bounded step at a time).
    Reindex,
}

#[derive(Debug, clap::Subcommand)]
enum SchedulesCommand {
    /// Lists them: name, schedule, time zone, next tick, last tick taken, state, since.
    List {
        queue: String,
        #[arg(long)]
        json: bool,
    },
    /// Pauses one for every process: its ticks are skipped, never caught up.
    Pause { queue: String, schedule: String },
    /// Resumes one; the ticks skipped while it was paused are not caught up.
    Resume { queue: String, schedule: String },
}

#[derive(Debug, clap::Subcommand)]
enum DeadLettersCommand {
    /// Lists dead letters: id, item, reason, stalls, failures, when (newest first).
    List {
        queue: String,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// From which end: last (newest first) or first (oldest first).
        #[arg(long, value_parser = end_of, default_value = "last")]
        from: End,
        #[arg(long)]
        json: bool,
    },
    /// Moves one dead letter back to the queue: LETTER is an id as `list` prints it, or an
    /// item's stored text (its oldest dead letter).
    Requeue {
        queue: String,
        letter: String,
        /// LETTER is an item's stored text, whatever it looks like.
        #[arg(long)]
        item: bool,
    },
    /// Deletes one dead letter, by its id. Asks first.
    Delete { queue: String, id: String },
    /// Moves every dead letter back to the queue. Asks first.
    RequeueAll { queue: String },
    /// Deletes every dead letter. Asks first.
    Purge { queue: String },
}

/// An item state as the command line names it (`in-flight` or `in_flight`).
fn state_of(name: &str) -> Result<ItemState, String> {
    let name = name.replace('-', "_");
    ItemState::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| "ready, delayed, in-flight, failing or dead".to_owned())
}

/// An end of a state's order as the command line names it.
fn end_of(name: &str) -> Result<End, String> {
    match name {
        "first" => Ok(End::First),
        "last" => Ok(End::Last),
        _ => Err("first or last".to_owned()),
    }
}

/// Runs `wq queue` (or an alias).
pub(crate) fn run(args: QueueArgs, alias: Alias) -> ExitCode {
    let name: &str = (&args.command).into();
    let command = format!("{} {name}", alias.tool());
    if let QueueCommand::Reindex = args.command {
        return reindex(&command, args.url, args.prefix.as_deref(), alias);
    }
    let opened = open::url(args.url, alias).and_then(|url| {
        let admin = open::open(&url, args.prefix.as_deref(), alias)?;
        Ok((redact_url(&url), admin))
    });
    let (server, admin) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("{command}: {}", escape(&e));
            return ExitCode::FAILURE;
        }
    };
    let run = Run {
        admin,
        server,
        alias,
        yes: args.yes,
        dry_run: args.dry_run,
    };
    crate::runtime::block_on_as(&command, run.command(args.command))
}

/// One command's admin and switches.
struct Run {
    admin: Box<dyn Admin>,
    /// The server's URL, without a secret, for messages.
    server: String,
    alias: Alias,
    yes: bool,
    dry_run: bool,
}

/// `value` as JSON, what a terminal acts on escaped as JSON escapes.
fn json<T: serde::Serialize>(value: &T, pretty: bool) -> Result<(), String> {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    println!("{}", text::escape_json(&text.map_err(|e| e.to_string())?));
    Ok(())
}

impl Run {
    async fn command(self, command: QueueCommand) -> Result<ExitCode, String> {
        let a = &*self.admin;
        match command {
            QueueCommand::List => {
                let queues = a.queues().await.map_err(|e| e.to_string())?;
                print!("{}", text::queues(&queues));
                eprintln!("{} queues", queues.len());
                print!("{}", text::server(&a.status()));
            }
            QueueCommand::Stats {
                queue,
                limit,
                groups,
                json: as_json,
            } => {
                let mut stats = a
                    .stats(&queue, limit.max(groups))
                    .await
                    .map_err(|e| self.fail(&queue, e))?;
                stats.leases.truncate(limit);
                stats.failures.truncate(limit);
                stats.groups.truncate(groups);
                if as_json {
                    json(&stats, true)?;
                    return Ok(ExitCode::SUCCESS);
                }
                let mut text = text::stats(&stats, &format!("{} resume", self.alias.tool()));
                if a.capabilities().actions && stats.summary.dead > 0 {
                    let dead = a.dead_letters(&queue, End::Last, limit).await;
                    text.push_str("  dead letters (newest first):\n");
                    for line in print::letters(&dead.map_err(|e| e.to_string())?).lines() {
                        text.push_str(&format!("    {line}\n"));
                    }
                }
                match a.schedules(&queue).await {
                    Ok(list) if !list.is_empty() => {
                        text.push_str(&format!("schedules\n{}", text::schedules("    ", &list)));
                    }
                    Ok(_) | Err(AdminError::Unsupported) => {}
                    Err(e) => {
                        text.push_str(&format!("schedules      {}\n", escape(&e.to_string())));
                    }
                }
                print!("{text}{}", text::server(&a.status()));
            }
            QueueCommand::Items {
                queue,
                state,
                from,
                limit,
                search,
                cursor,
            } => {
                let query = PageQuery::new(state, limit)
                    .from(from)
                    .cursor(cursor)
                    .search(search);
                let page = a
                    .page(&queue, &query)
                    .await
                    .map_err(|e| self.fail(&queue, e))?;
                for entry in &page.items {
                    json(entry, false)?;
                }
                let next = page
                    .next
                    .as_deref()
                    .map(|c| format!("; next: --cursor {c}"));
                let next = escape(next.as_deref().unwrap_or("")).into_owned();
                eprintln!("{} listed of {}{next}", page.items.len(), page.total);
            }
            QueueCommand::Item { queue, item } => {
                match a
                    .item_detail(&queue, &item)
                    .await
                    .map_err(|e| self.fail(&queue, e))?
                {
                    Some(detail) => json(&detail, true)?,
                    None => {
                        let (q, i) = (escape(&queue), escape(&item));
                        return Err(format!("queue {q} knows nothing of {i}"));
                    }
                }
            }
            QueueCommand::Pause { queue } => self.act(&queue, Action::Pause).await?,
            QueueCommand::Resume { queue } => self.resume(&queue).await?,
            QueueCommand::Shutdown { queue } => self.act(&queue, Action::ShutDownFleet).await?,
            QueueCommand::Retry { queue, item } => {
                self.act(&queue, Action::RetryNow { item }).await?;
            }
            QueueCommand::Remove { queue, item } => {
                self.act(&queue, Action::Remove { item }).await?;
            }
            QueueCommand::Forget { queue, item } => {
                self.act(&queue, Action::Forget { item }).await?;
            }
            QueueCommand::DeadLetters(command) => return self.dead_letters(command).await,
            QueueCommand::Schedules(SchedulesCommand::List {
                queue,
                json: as_json,
            }) => {
                let list = a
                    .schedules(&queue)
                    .await
                    .map_err(|e| self.fail(&queue, e))?;
                if as_json {
                    json(&list, true)?;
                } else {
                    print!("{}", text::schedules("", &list));
                }
            }
            QueueCommand::Schedules(SchedulesCommand::Pause { queue, schedule }) => {
                self.act(&queue, Action::PauseSchedule { schedule }).await?;
            }
            QueueCommand::Schedules(SchedulesCommand::Resume { queue, schedule }) => {
                self.act(&queue, Action::ResumeSchedule { schedule })
                    .await?;
            }
            QueueCommand::Reindex => unreachable!("run() reindexes before opening an admin"),
        }
        Ok(ExitCode::SUCCESS)
    }

    /// `e` as the operator reads it: a queue the server does not know is named.
    fn fail(&self, queue: &str, e: AdminError) -> String {
        match e {
            AdminError::NotFound => format!("no queue named {} on {}", escape(queue), self.server),
            e => e.to_string(),
        }
    }

    /// Does `action` to `queue` once the operator agreed ([`Self::confirm`]), and says
    /// what it did (in the words every older `wq` used, where it had them).
    async fn act(&self, queue: &str, action: Action) -> Result<(), String> {
        if !self.confirm(queue, &action).await? {
            return Ok(());
        }
        let (a, q, tool) = (&*self.admin, escape(queue), self.alias.tool());
        let fail = |e| self.fail(queue, e);
        match action {
            Action::ShutDownFleet => {
                a.shut_down_fleet(queue).await.map_err(fail)?;
                println!("queue {q} is shut down for every process ({tool} resume undoes it)");
            }
            Action::Pause if a.pause(queue).await.map_err(fail)? => {
                println!("queue {q} is paused for every process ({tool} resume undoes it)");
            }
            Action::Pause => println!("queue {q} was paused already"),
            Action::RequeueDeadLetters => {
                let n = a.requeue_dead_letters(queue).await.map_err(fail)?;
                println!("{n} dead letters requeued");
            }
            Action::PurgeDeadLetters => {
                let n = a.purge_dead_letters(queue).await.map_err(fail)?;
                println!("{n} dead letters purged");
            }
            action => {
                let outcome = act(a, queue, &action)
                    .await
                    .map_err(|e| match (e, &action) {
                        // The queue is there (`confirm` looked): what is not is the schedule.
                        (
                            AdminError::NotFound,
                            Action::PauseSchedule { schedule }
                            | Action::ResumeSchedule { schedule },
                        ) => format!("queue {q} has no schedule {}", escape(schedule)),
                        (e, _) => fail(e),
                    })?;
                println!("{}", escape(&outcome.message));
            }
        }
        Ok(())
    }

    /// Ends a fleet shut down and a pause, whichever is on.
    async fn resume(&self, queue: &str) -> Result<(), String> {
        let q = escape(queue);
        self.admin
            .summary(queue)
            .await
            .map_err(|e| self.fail(queue, e))?;
        if self.dry_run {
            println!(
                "would resume queue {q} on {} (end a shut down and a pause); nothing done (--dry-run)",
                self.server
            );
            return Ok(());
        }
        let was_shut = self
            .admin
            .resume_fleet(queue)
            .await
            .map_err(|e| e.to_string())?;
        let was_paused = self.admin.resume(queue).await.map_err(|e| e.to_string())?;
        let said = match (was_shut, was_paused) {
            (true, true) => "resumed (it was shut down and paused)",
            (true, false) => "resumed (it was shut down)",
            (false, true) => "resumed (it was paused)",
            (false, false) => "was neither shut down nor paused",
        };
        println!("queue {q} {said}");
        Ok(())
    }

    async fn dead_letters(&self, command: DeadLettersCommand) -> Result<ExitCode, String> {
        let a = &*self.admin;
        match command {
            DeadLettersCommand::List {
                queue,
                limit,
                from,
                json: as_json,
            } => {
                let letters = a.dead_letters(&queue, from, limit).await;
                let letters = letters.map_err(|e| self.fail(&queue, e))?;
                if as_json {
                    json(&letters, true)?;
                } else {
                    print!("{}", print::letters(&letters));
                    eprintln!("{} dead letters listed", letters.len());
                }
            }
            DeadLettersCommand::Requeue {
                queue,
                letter,
                item,
            } => {
                // An id of the queue's letters, else an item's text: its oldest letter.
                if !item && !self.dry_run {
                    match a.requeue_dead_letter_by_id(&queue, &letter).await {
                        Ok(true) => {
                            println!("requeued");
                            return Ok(ExitCode::SUCCESS);
                        }
                        Ok(false) | Err(AdminError::BadRequest(_)) => {}
                        Err(e) => return Err(self.fail(&queue, e)),
                    }
                }
                let id = if !item && self.dry_run && self.is_letter(&queue, &letter).await? {
                    Some(letter.clone())
                } else {
                    match a.item_detail(&queue, &letter).await {
                        Ok(d) => d.and_then(|d| d.dead_letters.first().map(|l| l.id.clone())),
                        Err(AdminError::BadRequest(_)) => None,
                        Err(e) => return Err(self.fail(&queue, e)),
                    }
                };
                let (l, q, tool) = (escape(&letter), escape(&queue), self.alias.tool());
                let Some(id) = id else {
                    eprintln!("{tool} dead-letters: no dead letter {l} in {q}");
                    return Ok(ExitCode::FAILURE);
                };
                if self.dry_run {
                    println!(
                        "would requeue dead letter {} of queue {q}; nothing done (--dry-run)",
                        escape(&id)
                    );
                } else if a
                    .requeue_dead_letter_by_id(&queue, &id)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    println!("requeued");
                } else {
                    eprintln!(
                        "{tool} dead-letters: no dead letter {l} in {q} (requeued or deleted already)"
                    );
                    return Ok(ExitCode::FAILURE);
                }
            }
            DeadLettersCommand::Delete { queue, id } => {
                self.act(&queue, Action::DeleteDeadLetter { id }).await?;
            }
            DeadLettersCommand::RequeueAll { queue } => {
                self.act(&queue, Action::RequeueDeadLetters).await?;
            }
            DeadLettersCommand::Purge { queue } => {
                self.act(&queue, Action::PurgeDeadLetters).await?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// Whether `id` is one of `queue`'s dead letters (among the newest 1,000: what
    /// `--dry-run` can tell without acting).
    async fn is_letter(&self, queue: &str, id: &str) -> Result<bool, String> {
        let letters = self.admin.dead_letters(queue, End::Last, 1000).await;
        Ok(letters
            .map_err(|e| self.fail(queue, e))?
            .iter()
            .any(|l| l.id == id))
    }

    /// Says what `action` will do to `queue` and whether to go on: a queue the server does
    /// not know is refused; `--dry-run` stops here; a destructive action asks on a
    /// terminal, and without one needs `--yes`.
    async fn confirm(&self, queue: &str, action: &Action) -> Result<bool, String> {
        let s = self
            .admin
            .summary(queue)
            .await
            .map_err(|e| self.fail(queue, e))?;
        let q = escape(queue);
        let target = escape(action.target().unwrap_or("")).into_owned();
        let what = match action {
            Action::ShutDownFleet => format!(
                "shut queue {q} down for every process ({} ready, {} in flight: every \
                 worker's get returns None once the ready ones are handed out)",
                s.depth, s.in_flight
            ),
            Action::PurgeDeadLetters => {
                format!("delete all {} dead letters of queue {q}, for good", s.dead)
            }
            Action::RequeueDeadLetters => {
                format!("requeue all {} dead letters of queue {q}", s.dead)
            }
            Action::DeleteDeadLetter { .. } => {
                format!("delete dead letter {target} of queue {q}, for good")
            }
            Action::Remove { .. } => {
                format!("take item {target} out of queue {q} and clear its failure count")
            }
            Action::Pause => format!("pause queue {q} for every process"),
            Action::RetryNow { .. } => format!("queue item {target} of queue {q} now"),
            Action::Forget { .. } => {
                format!("clear the failure count of item {target} in queue {q}")
            }
            Action::PauseSchedule { .. } => {
                format!("pause schedule {target} of queue {q} for every process")
            }
            Action::ResumeSchedule { .. } => format!("resume schedule {target} of queue {q}"),
            other => format!("{} queue {q}", other.name()),
        };
        let what = format!("{what} on {}", self.server);
        if self.dry_run {
            println!("would {what}; nothing done (--dry-run)");
            return Ok(false);
        }
        let asks = matches!(
            action,
            Action::ShutDownFleet
                | Action::PurgeDeadLetters
                | Action::RequeueDeadLetters
                | Action::DeleteDeadLetter { .. }
                | Action::Remove { .. }
        );
        if !asks || self.yes {
            return Ok(true);
        }
        if !std::io::stdin().is_terminal() {
            return Err(format!(
                "this would {what}: pass --yes to do it without a terminal to confirm on \
                 (--dry-run only says what it would do)"
            ));
        }
        eprint!("This will {what}.\nGo on? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .map_err(|e| format!("no answer: {e}"))?;
        if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            Ok(true)
        } else {
            Err("not confirmed: nothing done".into())
        }
    }
}

/// `wq queue reindex`: [`workq_redis::RedisAdmin::reindex`] on the Redis server of the URL.
fn reindex(command: &str, url: Option<String>, prefix: Option<&str>, alias: Alias) -> ExitCode {
    let admin = open::url(url, alias).and_then(|url| {
        if open::backend_of(&url)? != open::Backend::Redis {
            return Err("reindex is for Redis: PostgreSQL lists its queues from a table".into());
        }
        workq_redis::RedisAdmin::new(&url, prefix.unwrap_or("wq")).map_err(|e| e.to_string())
    });
    let admin = match admin {
        Ok(admin) => admin,
        Err(e) => {
            eprintln!("{command}: {}", escape(&redact_urls_in(&e)));
            return ExitCode::FAILURE;
        }
    };
    crate::runtime::block_on_as(command, async {
        let found = admin.reindex().await;
        let found = found.map_err(|e| redact_urls_in(&e.to_string()))?;
        println!("{found} queue names found and indexed; the listings scan no more");
        Ok::<_, String>(ExitCode::SUCCESS)
    })
}
