use clap::Parser;
use mqa_fuzz::cli::{dispatch, Cli};
use mqa_fuzz::error::exit;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::CLEAN
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(fatal) => {
            eprintln!("mqa-fuzz: {}", fatal.message);
            fatal.code
        }
    };
    std::process::exit(code);
}
