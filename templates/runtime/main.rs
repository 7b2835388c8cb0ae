//! Command-line text generation: load the model once, run one prompt, stream or print JSON.

use std::cell::{Cell, OnceCell};
use std::io::{self, Write};
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::process::ExitCode;
use std::thread::JoinHandle;
use std::time::Instant;

use clap::Parser;
use serde_json::{Map, Value, json};

use __crate::tokenizer::TextStream;
use __crate::{Error, GenerateParams, Model, Tokenizer, WORKLOAD};
#[only_if(batched)]
use __crate::MAX_BATCH;

/// The options that say what to run: exactly one of them.
#[only_if(not(prefix_cache))]
const INPUTS: [&str; 3] = ["prompt", "prompt_ids", "save_model"];
/// The options that say what to run: exactly one of them.
#[only_if(prefix_cache)]
const INPUTS: [&str; 4] = ["prompt", "prompt_ids", "prompts", "save_model"];

/// Generates text with the model this crate was generated for.
#[derive(Parser)]
#[command(version, about, long_about = None)]
#[command(group(clap::ArgGroup::new("input").required(true).args(INPUTS)))]
struct Args {
    /// Model directory holding model.safetensors and tokenizer.json.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Prompt text, encoded with the model's tokenizer (which adds BOS where it is configured to).
    #[arg(long, value_name = "TEXT")]
    prompt: Option<String>,
    /// Prompt token ids, comma-separated, used exactly as given.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// A file of prompt texts, one a line (empty lines skipped), run in order in one session:
    /// each keeps the start it shares with the one before (the prefix cache) and reads only the
    /// rest. Prints each one's text, or with --json one object a line.
    #[only_if(prefix_cache)]
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// Runs N copies of the prompt as one batch (1 to the crate's MAX_BATCH): their decode
    /// steps run together, each copy's token a row of one step, and each copy gets the tokens
    /// the prompt gets alone. Prints each copy's text, or with --json their ids under
    /// "sequences" and the batch's timings.
    #[only_if(batched)]
    #[arg(long, value_name = "N", default_value_t = 1)]
    batch: usize,
    /// Number of new tokens to generate at most.
    #[arg(long, value_name = "N", default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, value_name = "T", default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Sample among the K most likely tokens only; 0 keeps all.
    #[arg(long, value_name = "K", default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely tokens whose probabilities add up to P; 1 keeps all.
    #[arg(long, value_name = "P", default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Seed for sampling: the same seed gives the same text.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Print one JSON object (ids, text, timings) instead of streaming the text.
    #[arg(long)]
    json: bool,
    /// Instead of generating, write DIR: the model directory of --model with its weights as
    /// this crate holds them in memory (e.g. quantized, for an int8 crate), which later runs
    /// load without converting them.
    #[arg(long, value_name = "DIR")]
    save_model: Option<PathBuf>,
    /// Instead of generating, write the logits of every position of the prompt to FILE:
    /// little-endian f32, [prompt length, VOCAB_SIZE] (what the device check compares with the
    /// reference outputs).
    #[only_if(cuda)]
    #[arg(long, value_name = "FILE")]
    logits: Option<PathBuf>,
}

fn main() -> ExitCode {
    let started = Instant::now();
    let args = Args::parse();
    match run(&args, started) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(args: &Args, started: Instant) -> Result<(), Error> {
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    params.validate()?;
    if let Err(source) = std::fs::read_dir(&args.model) {
        return Err(Error::Io { path: args.model.clone(), source });
    }
    if let Some(out) = &args.save_model {
        for warning in Model::save_model(&args.model, out)? {
            eprintln!("warning: {warning}");
        }
        let seconds = started.elapsed().as_secs_f64();
        eprintln!("wrote {} in {seconds:.2} s", out.display());
        return Ok(());
    }
    // The tokenizer is read on a second thread while this one maps the weights and, for a
    // prompt of ids, runs it: ids need the tokenizer only to print text, so it is waited for
    // at the first token (at the end for JSON). A model that fails to load is reported first.
    let tokenizer = TokenizerThread::spawn(args);
    // The process ends when `run` returns, so the model and the tokenizer are never freed:
    // freeing a 32000-word tokenizer's maps alone would delay the exit by 3-4 ms.
    let model = ManuallyDrop::new(Model::load(&args.model)?);
    for warning in model.warnings() {
        eprintln!("warning: {warning}");
    }
    #[only_if(prefix_cache)]
    if let Some(file) = &args.prompts {
        return run_prompts(args, &model, &tokenizer, &params, file);
    }
    let prompt_ids = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) if text.is_empty() => return Err(Error::EmptyPrompt),
        (Some(text), _) => tokenizer.get()?.encode(text)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => return Err(Error::EmptyPrompt),
    };
    let load_ms = started.elapsed().as_secs_f64() * 1000.0;
    #[only_if(cuda)]
    if let Some(file) = &args.logits {
        let logits = model.session().logits_all(&prompt_ids)?;
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(file, bytes).map_err(|source| Error::Io { path: file.clone(), source })?;
        return Ok(());
    }
    #[only_if(batched)]
    if args.batch != 1 {
        return run_batch(args, &model, &tokenizer, &params, &prompt_ids, load_ms);
    }
    let mut session = model.session();
    session.check(&prompt_ids)?;

    if args.json {
        let generation = session.generate(&prompt_ids, &params, |_| true)?;
        let text = tokenizer.get()?.decode(&generation.generated_ids)?;
        let report = Value::Object(Map::from_iter([
            ("workload".to_string(), json!(WORKLOAD)),
            ("prompt_ids".to_string(), json!(generation.prompt_ids)),
            ("generated_ids".to_string(), json!(generation.generated_ids)),
            ("text".to_string(), json!(text)),
            ("stop".to_string(), json!(generation.stop.as_str())),
            ("load_ms".to_string(), json!(load_ms)),
            ("prefill_ms".to_string(), json!(generation.prefill_ms)),
            ("prefill_tok_s".to_string(), json!(generation.prefill_tok_s())),
            ("decode_ms".to_string(), json!(generation.decode_ms)),
            ("decode_tok_s".to_string(), json!(generation.decode_tok_s())),
        ]));
        #[only_if(speculation)]
        let report = {
            let mut report = report;
            report["drafted"] = json!(generation.drafted);
            report["accepted"] = json!(generation.accepted);
            report
        };

        // A closed stdout (e.g. `| head`) is not an error worth reporting.
        let _ = writeln!(io::stdout().lock(), "{report}");
        return Ok(());
    }

    // Stream: the prompt as the tokenizer reads it, at the first token (the tokenizer may still
    // be read until then), then each new piece as it is generated.
    let mut printer =
        Printer { tokenizer: &tokenizer, prompt_ids: &prompt_ids, stream: None, out: io::stdout().lock(), open: true };
    let mut decode_error = None;
    let generation = session.generate(&prompt_ids, &params, |id| {
        if let Err(e) = printer.push(id) {
            decode_error = Some(e);
        }
        printer.open && decode_error.is_none()
    })?;
    if let Some(e) = decode_error {
        return Err(e);
    }
    // With no new token, the prompt is printed now.
    printer.stream()?;
    if !printer.open || writeln!(printer.out).is_err() {
        return Ok(());
    }
    let prompt_tokens = generation.prompt_ids.len();
    let new_tokens = generation.generated_ids.len();
    let prefill = generation.prefill_tok_s();
    let decode = generation.decode_tok_s();
    let stop = generation.stop.as_str();
    eprintln!(
        "[{prompt_tokens} prompt tokens: prefill {prefill:.1} tok/s; {new_tokens} new tokens: decode {decode:.1} tok/s; stop: {stop}]"
    );
    #[only_if(speculation)]
    eprintln!("[speculation: {} tokens drafted, {} kept]", generation.drafted, generation.accepted);
    Ok(())
}

/// Runs `args.batch` copies of `prompt_ids` as one batch (`Batch::generate`); prints each
/// copy's text and a line of figures for the batch, or with --json one object.
#[only_if(batched)]
fn run_batch(
    args: &Args,
    model: &Model,
    tokenizer: &TokenizerThread,
    params: &GenerateParams,
    prompt_ids: &[u32],
    load_ms: f64,
) -> Result<(), Error> {
    if args.batch == 0 || args.batch > MAX_BATCH {
        return Err(Error::InvalidParameter {
            name: "batch",
            reason: format!("must be between 1 and {MAX_BATCH}, the most sequences this crate runs at once"),
        });
    }
    let prompts = vec![prompt_ids; args.batch];
    let generations = model.batch().generate(&prompts, params)?;
    let tokenizer = tokenizer.get()?;
    // the prompts ran one after another; the decode steps ran together until the last one ended
    let prefill_ms: f64 = generations.iter().map(|g| g.prefill_ms).sum();
    let decode_ms = generations.iter().map(|g| g.decode_ms).fold(0.0, f64::max);
    let decode_tokens: usize = generations.iter().map(|g| g.decode_steps).sum();
    let decode_steps = generations.iter().map(|g| g.decode_steps).max().unwrap_or(0);
    let rate = |tokens: usize, ms: f64| if ms > 0.0 { tokens as f64 / (ms / 1000.0) } else { 0.0 };
    let mut out = io::stdout().lock();
    let written = if args.json {
        let mut sequences = Vec::with_capacity(generations.len());
        for g in &generations {
            sequences.push(json!({
                "generated_ids": g.generated_ids,
                "text": tokenizer.decode(&g.generated_ids)?,
                "stop": g.stop.as_str(),
            }));
        }
        let report = json!({
            "workload": WORKLOAD,
            "batch": args.batch,
            "prompt_ids": prompt_ids,
            "sequences": sequences,
            "load_ms": load_ms,
            "prefill_ms": prefill_ms,
            "prefill_tok_s": rate(prompt_ids.len() * args.batch, prefill_ms),
            "decode_ms": decode_ms,
            "decode_steps": decode_steps,
            "decode_tok_s": rate(decode_tokens, decode_ms),
        });
        writeln!(out, "{report}")
    } else {
        let mut written = Ok(());
        for g in &generations {
            let whole = tokenizer.decode(&[prompt_ids, &g.generated_ids[..]].concat())?;
            written = written.and_then(|()| writeln!(out, "{whole}"));
        }
        written.map(|()| {
            eprintln!(
                "[{} sequences of {} prompt tokens: prefill {:.1} tok/s; {decode_tokens} tokens in {decode_steps} decode steps: decode {:.1} tok/s in all]",
                args.batch,
                prompt_ids.len(),
                rate(prompt_ids.len() * args.batch, prefill_ms),
                rate(decode_tokens, decode_ms)
            )
        })
    };
    // A closed stdout (e.g. `| head`) is not an error worth reporting.
    let _ = written;
    Ok(())
}

/// Runs the prompts of `file` in order in one session (`Session::generate_anew`), each after
/// the start it shares with what the session holds; prints each one's text and a line of
/// figures (with --json, one object a line).
#[only_if(prefix_cache)]
fn run_prompts(
    args: &Args,
    model: &Model,
    tokenizer: &TokenizerThread,
    params: &GenerateParams,
    file: &PathBuf,
) -> Result<(), Error> {
    #[only_if(batched)]
    if args.batch != 1 {
        return Err(Error::InvalidParameter {
            name: "batch",
            reason: "runs copies of one prompt (--prompt or --prompt-ids), not a file of prompts".to_string(),
        });
    }
    let text = std::fs::read_to_string(file).map_err(|source| Error::Io { path: file.clone(), source })?;
    let tokenizer = tokenizer.get()?;
    let mut session = model.session();
    let mut out = io::stdout().lock();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let prompt_ids = tokenizer.encode(line)?;
        let generation = session.generate_anew(&prompt_ids, params, |_| true)?;
        let completion = tokenizer.decode(&generation.generated_ids)?;
        let written = if args.json {
            let report = json!({
                "workload": WORKLOAD,
                "prompt": line,
                "reused": generation.reused,
                "prompt_ids": prompt_ids,
                "generated_ids": generation.generated_ids,
                "text": completion,
                "stop": generation.stop.as_str(),
                "prefill_ms": generation.prefill_ms,
                "decode_ms": generation.decode_ms,
            });
            writeln!(out, "{report}")
        } else {
            let whole = tokenizer.decode(&[&prompt_ids[..], &generation.generated_ids[..]].concat())?;
            writeln!(out, "{whole}").and_then(|()| {
                eprintln!(
                    "[{} prompt tokens, {} of them kept from the one before: prefill {:.1} ms; {} new tokens; stop: {}]",
                    prompt_ids.len(),
                    generation.reused,
                    generation.prefill_ms,
                    generation.generated_ids.len(),
                    generation.stop.as_str()
                );
                Ok(())
            })
        };
        // A closed stdout (e.g. `| head`) ends the run without an error.
        if written.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// The tokenizer, read on a thread of its own until something first needs it.
struct TokenizerThread {
    reading: Cell<Option<JoinHandle<Result<Tokenizer, Error>>>>,
    read: OnceCell<ManuallyDrop<Tokenizer>>,
}

impl TokenizerThread {
    /// Starts reading the tokenizer of `args.model`: the whole of it for a text prompt, only
    /// what decodes for ids.
    fn spawn(args: &Args) -> TokenizerThread {
        let (dir, encodes) = (args.model.clone(), args.prompt.is_some());
        #[only_if(prefix_cache)]
        let encodes = encodes || args.prompts.is_some();
        let reading = std::thread::spawn(move || {
            if encodes { Tokenizer::load_with_encoder(&dir) } else { Tokenizer::load(&dir) }
        });
        TokenizerThread { reading: Cell::new(Some(reading)), read: OnceCell::new() }
    }

    /// The tokenizer, once its thread has read it: the first call waits for that.
    fn get(&self) -> Result<&Tokenizer, Error> {
        if let Some(reading) = self.reading.take() {
            let tokenizer = reading.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            let _ = self.read.set(ManuallyDrop::new(tokenizer));
        }
        Ok(self.read.get().expect("a tokenizer that failed to load ends the run"))
    }
}

/// Streams the text to stdout: the prompt's, from the first call on, then each new piece.
struct Printer<'a> {
    tokenizer: &'a TokenizerThread,
    prompt_ids: &'a [u32],
    stream: Option<TextStream<'a>>,
    out: io::StdoutLock<'static>,
    /// Whether stdout is still open: a closed one (e.g. `| head`) is not an error worth
    /// reporting, and ends the run.
    open: bool,
}

impl<'a> Printer<'a> {
    /// The stream of the text, which the first call starts by printing the prompt.
    fn stream(&mut self) -> Result<&mut TextStream<'a>, Error> {
        let stream = match self.stream.take() {
            Some(stream) => stream,
            None => {
                let mut stream = self.tokenizer.get()?.stream();
                for &id in self.prompt_ids {
                    if let Some(piece) = stream.push(id)? {
                        self.open = self.open && write!(self.out, "{piece}").is_ok();
                    }
                }
                stream
            }
        };
        Ok(self.stream.insert(stream))
    }

    /// Prints the text that new token `id` completes, if any.
    fn push(&mut self, id: u32) -> Result<(), Error> {
        if let Some(piece) = self.stream()?.push(id)? {
            self.open = self.open && write!(self.out, "{piece}").and_then(|()| self.out.flush()).is_ok();
        }
        Ok(())
    }
}
