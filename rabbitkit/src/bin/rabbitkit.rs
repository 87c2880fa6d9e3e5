//! The `rabbitkit` operator command line; see `docs/OPERATOR-CLI.md` or `rabbitkit --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rabbitkit: cannot start the runtime: {e}");
            return ExitCode::from(rabbitkit::cli::EXIT_FAILED);
        }
    };
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let code = runtime.block_on(rabbitkit::cli::run(
        std::env::args_os(),
        &mut stdout.lock(),
        &mut stderr.lock(),
    ));
    ExitCode::from(code)
}
