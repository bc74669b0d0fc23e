//! The floodgate command line: run the gateway, or check a config.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use floodgate::config::Config;
use floodgate::server::{build, ProcessFlags};

// jemalloc instead of the system allocator: the request path allocates small, short-lived
// buffers from several threads, and the load benchmark measured about 9% more requests per
// second with it (docs/benchmarks.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// An HTTP API gateway whose reason to exist is rate limiting done right.
#[derive(Parser, Debug)]
#[command(name = "floodgate", version)]
struct Cli {
    /// The gateway.toml to run.
    #[arg(
        short = 'c',
        long = "config",
        default_value = "gateway.toml",
        global = true
    )]
    config: PathBuf,
    /// Take over the listening sockets of a running floodgate (zero-downtime upgrade).
    #[arg(short = 'u', long)]
    upgrade: bool,
    /// Run in the background.
    #[arg(short = 'd', long)]
    daemon: bool,
    /// Unix socket used to hand listeners over on --upgrade.
    #[arg(long, default_value = "/tmp/floodgate_upgrade.sock")]
    upgrade_sock: String,
    /// Where to write the pid.
    #[arg(long, default_value = "/tmp/floodgate.pid")]
    pid_file: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate the config and print the routes and rules in the order they are checked.
    Check,
    /// Print a Mermaid flowchart of the request path and the rules.
    Diagram,
    /// Print the JSON Schema (draft-07) of gateway.toml, for editors (a `#:schema` line).
    Schema,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check) => match Config::load(&cli.config) {
            Ok(cfg) => {
                print!("{}", floodgate::describe::check_report(&cfg));
                if let Some(rls) = &cfg.rls {
                    print!("{}", floodgate::rls::describe::report(rls));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Some(Command::Diagram) => match Config::load(&cli.config) {
            Ok(cfg) => {
                print!("{}", floodgate::describe::diagram(&cfg));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        // The schema describes the file format, not a file: no config is read.
        Some(Command::Schema) => {
            print!("{}", floodgate::config::json_schema::gateway_schema());
            ExitCode::SUCCESS
        }
        None => {
            let cfg = match Config::load(&cli.config) {
                Ok(cfg) => cfg,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            floodgate::logging::init(cfg.server.log_format);
            let flags = ProcessFlags {
                upgrade: cli.upgrade,
                daemon: cli.daemon,
                upgrade_sock: Some(cli.upgrade_sock),
                pid_file: Some(cli.pid_file),
            };
            for w in &cfg.warnings {
                tracing::warn!("{w}");
            }
            tracing::info!(config = %cfg.path.display(), listen = ?cfg.server.listen, admin = %cfg.server.admin_listen, "floodgate starting");
            // Every client connection is a descriptor: take all the kernel allows.
            match floodgate::connection::raise_nofile_limit() {
                Ok(n) => {
                    tracing::info!(
                        open_files = n,
                        "open-file limit (RLIMIT_NOFILE) raised to the hard limit"
                    );
                    let rls_max = cfg.rls.as_ref().map_or(0, |r| r.serving.max_connections);
                    let budget = floodgate::connection::set_open_file_limit(n, rls_max);
                    if budget.clients < cfg.server.connections.max_connections {
                        tracing::warn!(
                            open_files = n,
                            max_connections = cfg.server.connections.max_connections,
                            client_connections = budget.clients,
                            "the open-file limit allows fewer client connections than \
                             max_connections: past this many, new connections are closed"
                        );
                    }
                    if rls_max > budget.rls {
                        tracing::warn!(
                            open_files = n,
                            rls_max_connections = rls_max,
                            rls_connections = budget.rls,
                            "the open-file limit allows fewer rate-limit service connections \
                             than rls.max_connections: past this many, new ones are closed"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot raise the open-file limit (RLIMIT_NOFILE)")
                }
            }
            let grace = cfg.server.grace_period;
            match build(cfg, &flags) {
                Ok(server) => {
                    server.run(pingora::server::RunArgs {
                        shutdown_signal: Box::new(floodgate::shutdown::Signals::new(grace)),
                    });
                    std::process::exit(0)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
