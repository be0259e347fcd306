//! The one `ting-chaos` binary: parses flags and dispatches thinly into the crates.
//!
//! `run`, `validate`, `schema`, `bench`, `mocks`, `db` belong to the harness library;
//! `stack api|worker|migrate` are the reference stack's process roles, linked here so one installed
//! binary serves both. This file is the only place the harness and the stack meet, and it passes
//! nothing between them: the harness spawns `ting-chaos stack …` as a child through the contract.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ting_chaos::exit;

#[derive(Parser)]
#[command(name = "ting-chaos", version, about = "Load and chaos tests for notification delivery stacks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check scenario files; exit 0 when all are valid, 2 otherwise.
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the JSON Schema of scenario files.
    Schema,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Validate { files } => validate(&files),
        Command::Schema => {
            println!("{}", serde_json::to_string_pretty(&ting_chaos::scenario::json_schema()).unwrap());
            exit::OK
        }
    };
    ExitCode::from(code as u8)
}

fn validate(files: &[PathBuf]) -> i32 {
    let mut code = exit::OK;
    for f in files {
        match ting_chaos::scenario::load(f) {
            Ok(s) => println!("ok: {} ({})", f.display(), s.name),
            Err(e) => {
                eprintln!("error: {e}");
                code = exit::USAGE;
            }
        }
    }
    code
}
