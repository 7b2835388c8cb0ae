//~ The `serve` subcommand of a serving crate's binary: the emitter (emit/common.rs) appends these
//~ items to runtime/main.rs and makes `main` hand `serve ...` to `serve`. Lines starting with
//~ `//~`, like these, are not generated. Its `use` lines join main.rs's.
use __crate::serve::{Options, ServeError, Server};

/// __serve_about
#[derive(Parser)]
#[command(name = "serve", long_about = None)]
struct ServeArgs {
    /// __serve_model
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Address to listen on; the default takes connections from this machine only.
    #[arg(long, value_name = "HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (printed on the first line).
    #[arg(long, value_name = "N", default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/ routes (default: the MONOGEN_API_KEY
    /// environment variable, if set).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
}

/// `BINARY serve ...`: listens, prints `listening on http://HOST:PORT`, serves until SIGTERM or
/// SIGINT, then finishes the requests it took and exits.
fn serve() -> ExitCode {
    let args = ServeArgs::parse_from(std::env::args_os().skip(1));
    let options = Options {
        model: args.model,
        host: args.host,
        port: args.port,
        api_key: args.api_key.or_else(|| std::env::var("MONOGEN_API_KEY").ok()),
    };
    let server = match Server::start(&options) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("error: {e}");
            // A bad model directory exits as the command line's does.
            return ExitCode::from(if let ServeError::Model(e) = &e { e.exit_code() } else { 1 });
        }
    };
    println!("listening on http://{}", server.addr());
    let _ = io::stdout().flush();
    server.wait_for_signal();
    eprintln!("stopping: finishing the requests taken");
    server.stop();
    ExitCode::SUCCESS
}
