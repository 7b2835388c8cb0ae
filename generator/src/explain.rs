//! `monogen explain`: the plan in words, every candidate with its verdict and evidence.

use std::path::Path;

use crate::plan::{BertConsts, Consts, InterfacePlan, LlamaConsts, Plan, Verdict, human_bytes, human_ns};
use crate::rankings::Evidence;
use crate::shown;

/// ` (slowest X)`: a packing's time with each matrix's slowest of its three packings, where the
/// record has it.
pub(crate) fn slowest(load_max_ns: Option<f64>) -> String {
    load_max_ns.map(|ns| format!(" (slowest {})", human_ns(ns))).unwrap_or_default()
}

/// The evidence of one candidate, for `explain`.
fn evidence_line(evidence: &Evidence) -> Option<String> {
    let measured = |r: &crate::rankings::Record| {
        let slowest = slowest(r.load_max_ns.map(|ns| ns as f64));
        let load = match (r.load_ns, r.load_counted_ns) {
            // Counted or not, the workload's `request:` line says; a stale record is never counted.
            (Some(load), 0) => format!("; packing at load {}{slowest}", human_ns(load as f64)),
            (Some(load), share) => {
                format!(
                    "; packing at load {}{slowest}, {} of it counted per request",
                    human_ns(load as f64),
                    human_ns(share as f64)
                )
            }
            (None, _) => String::new(),
        };
        format!(
            "{} per request (p90 {}, {} samples; prefill pass {}, decode step {}{load}), measured {} with {}",
            human_ns(r.median_ns as f64),
            human_ns(r.p90_ns as f64),
            r.samples,
            human_ns(r.prefill_median_ns as f64),
            human_ns(r.decode_median_ns as f64),
            r.measured_at,
            r.rustc
        )
    };
    match evidence {
        Evidence::NoHardwareClass => None,
        Evidence::Measured(r) => Some(format!("evidence: {}", measured(r))),
        Evidence::Failed(r) => Some(format!("evidence: failed validation, measured {}", r.measured_at)),
        Evidence::Stale { record, why } => {
            Some(format!("evidence: STALE ({}); was {}", why.join("; "), measured(record)))
        }
        Evidence::Missing => None,
    }
}

/// The text form of `monogen explain`.
pub fn render(plan: &Plan, path: &Path, out_dir: &Path) -> String {
    let mut s = header(plan, path);
    for i in &plan.interfaces {
        s.push_str(&interface(i));
    }
    if let Consts::Llama(c) = &plan.consts
        && let Some(draft) = c.draft()
    {
        s.push_str(&draft_model(draft));
    }
    s.push_str(&footer(plan, out_dir));
    s
}

/// A draft model's crate (`draft/`): what it is and each of its choices, as its own `explain`
/// gives them in full.
fn draft_model(draft: &Plan) -> String {
    let mut s = format!(
        "
draft model (speculator = \"draft-model\"): crate `{}` in {}/, {} weights ({} parameters), drafting greedily for this model to verify; the memory below counts it\n",
        draft.name,
        crate::emit::DRAFT_DIR,
        draft.weights.dtype.as_str(),
        draft.footprint.parameters
    );
    for i in &draft.interfaces {
        let element = i.element.as_ref().map_or_else(String::new, |e| format!("<{e}>"));
        s.push_str(&format!(
            "  {}{element}: {} {}, {}\n",
            i.title(),
            i.chosen.name,
            i.chosen.version,
            i.chosen.reason
        ));
    }
    s
}

/// The workload: model, target, request.
fn header(plan: &Plan, path: &Path) -> String {
    let w = plan;
    let mut s = String::new();
    s.push_str(&format!("workload {} ({})\n", w.name, path.display()));
    let model = match &plan.consts {
        Consts::Llama(c) => format!(
            "llama with {} layers, hidden {}, mlp {}, {} heads / {} kv heads of {}, vocab {}, {} embeddings",
            c.num_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.vocab_size,
            if c.tie_word_embeddings { "tied" } else { "untied" }
        ),
        Consts::Bert(c) => format!(
            "bert with {} layers, hidden {}, mlp {}, {} heads of {}, vocab {}, {} positions, {} pooling{}",
            c.num_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_heads,
            c.head_dim,
            c.vocab_size,
            c.max_position_embeddings,
            c.pooling.as_str(),
            if c.normalize { ", L2-normalized" } else { "" }
        ),
    };
    s.push_str(&format!("  model:   {model}\n"));
    s.push_str(&format!(
        "  target:  {} {} [{}], {} thread{}, {} weights, hardware class {}\n",
        w.target.device.as_str(),
        w.target.arch,
        w.target.cpu_features.join(", "),
        w.target.threads,
        if w.target.threads == 1 { "" } else { "s" },
        w.weights.dtype.as_str(),
        w.target.hardware.as_deref().unwrap_or("none (kernels chosen by declared priority)")
    ));
    let request = match &plan.consts {
        Consts::Llama(c) => format!(
            "batch {}, up to {} positions (typical prompt {}, decode {})",
            c.request.max_batch,
            c.request.max_seq_len,
            c.request.typical_prompt_len,
            c.request.typical_decode_len
        ),
        Consts::Bert(c) => format!(
            "up to {} sentences of up to {} tokens (typical {} of {})",
            c.request.max_batch, c.request.max_seq_len, c.request.typical_batch, c.request.typical_seq_len
        ),
    };
    let load = match plan.consts.requests_per_load() {
        Some(1) => "; each request loads the model (packing at load counted in full)".to_string(),
        Some(n) => format!("; {n} requests per load of the model (packing at load counted, shared by them)"),
        None => String::new(),
    };
    s.push_str(&format!("  request: {request}{load}\n"));
    if let Consts::Llama(LlamaConsts { serving: Some(serving), request, .. }) = &plan.consts {
        let chat = if serving.chat.is_some() { "completions and chat completions" } else { "completions" };
        let prefix = match serving.prefix_cache_min {
            Some(min) => format!(
                "; a prefix cache: finished requests' KV caches are kept among the slots, and a request that starts with at least {min} of one's tokens reads only the rest"
            ),
            None => String::new(),
        };
        s.push_str(&format!(
            "  serving: an OpenAI-compatible server (`serve`, {chat}) batching up to {} sequences; classes {} (default {}); {} requests may wait; {} KV slots{prefix}\n",
            request.max_batch,
            serving.priorities.join(" > "),
            serving.default_priority,
            serving.max_queue,
            serving.kv_slots
        ));
    }
    if let Consts::Llama(c) = &plan.consts
        && c.serving.is_none()
        && let Some(min) = c.prefix_cache_min()
    {
        s.push_str(&format!(
            "  prefix cache: a session's `generate_anew` keeps the positions it holds that a new prompt starts with, at least {min} of them, and runs only the rest\n"
        ));
    }
    if let Consts::Llama(LlamaConsts { speculation: Some(spec), .. }) = &plan.consts
        && let Some(draft) = &spec.draft
    {
        s.push_str(&format!(
            "  speculation: the draft model `{}` (below) drafts up to {} tokens greedily, verified in one pass of up to {} rows; output as without it\n",
            draft.name,
            spec.draft_tokens,
            spec.draft_tokens + 1
        ));
    } else if let Consts::Llama(LlamaConsts { speculation: Some(spec), .. }) = &plan.consts {
        s.push_str(&format!(
            "  speculation: {} drafts up to {} tokens (n-grams of {} down to {}), verified in one pass of up to {} rows; output as without it\n",
            spec.speculator,
            spec.draft_tokens,
            spec.lookup_max,
            spec.lookup_min,
            spec.draft_tokens + 1
        ));
    }
    if let Consts::Llama(LlamaConsts { speculation_measured: Some(m), .. }) = &plan.consts {
        // One figure a line: the reason is `;`-separated.
        s.push_str("  speculation chosen by measurement (speculator = \"measured\"):\n");
        for part in m.reason.split("; ") {
            s.push_str(&format!("    {part}\n"));
        }
    }
    if let Consts::Bert(BertConsts { serving: Some(serving), max_batch, .. }) = &plan.consts {
        s.push_str(&format!(
            "  serving: an OpenAI-compatible embeddings server (`serve`) batching up to {max_batch} sentences, waiting up to {} ms for a batch to fill; {} requests may wait\n",
            serving.batch_wait_ms, serving.max_queue
        ));
    }
    s
}

/// One interface: every candidate with its verdict and evidence.
fn interface(i: &InterfacePlan) -> String {
    let mut s = String::new();
    {
        let role = i.role.as_ref().map_or_else(String::new, |r| format!(" ({r})"));
        match &i.element {
            Some(element) => {
                s.push_str(&format!("\n{}<{element}>{role}: {}\n", i.interface, i.summary));
                s.push_str(&format!(
                    "  element type {element}: takes {} (implementations of other element types do not compete)\n",
                    crate::registry::describe_takes(&i.takes)
                ));
            }
            None => s.push_str(&format!("\n{}{role}: {}\n", i.interface, i.summary)),
        }
        for cand in &i.candidates {
            let head = format!("  {} {} (priority {})", cand.name, cand.version, cand.priority);
            let line = match &cand.verdict {
                Verdict::Chosen { reason } => format!("{head}: CHOSEN, {reason}"),
                Verdict::Outranked { reason, .. } => format!("{head}: compatible, not chosen: {reason}"),
                Verdict::Shadowed { by } => {
                    format!("{head}: compatible, replaced by {by} (which shadows it)")
                }
                Verdict::Failed { failure } => {
                    format!("{head}: FAILED against the reference when measured, never chosen: {failure}")
                }
                Verdict::Rejected { reasons } => format!("{head}: rejected: {}", reasons.join("; ")),
            };
            s.push_str(&line);
            s.push('\n');
            if let Some(evidence) = &cand.evidence
                && let Some(text) = evidence_line(evidence)
            {
                s.push_str(&format!("      {text}\n"));
            }
        }
        for note in &i.unmeasured {
            s.push_str(&format!("  ! {note}\n"));
        }
    }
    s
}

/// The start-up check, the memory and where the crate goes.
fn footer(plan: &Plan, out_dir: &Path) -> String {
    let w = plan;
    let mut s = String::new();
    let f = &plan.footprint;
    s.push_str(&format!(
        "\nstart-up check: {}\n",
        if plan.cpu_features.is_empty() {
            "none (no kernel needs a CPU feature)".to_string()
        } else {
            plan.cpu_features.join(", ")
        }
    ));
    let per_run = match &plan.consts {
        Consts::Llama(c) if c.request.max_batch == 1 => format!(
            "per session: KV cache {} ({}), activations {}",
            human_bytes(f.kv_cache_bytes),
            c.kv_dtype.as_str(),
            human_bytes(f.scratch_bytes)
        ),
        Consts::Llama(c) => format!(
            "KV cache {} ({}) per sequence, {} in all for {} {} (taken as positions fill them); activations {} per batch of {} sequences, {} positions a step",
            human_bytes(f.kv_cache_bytes),
            c.kv_dtype.as_str(),
            human_bytes(f.kv_cache_bytes * f.kv_caches),
            f.kv_caches,
            if c.serving.is_some() { "KV slots of the server" } else { "sequences, a full batch" },
            human_bytes(f.scratch_bytes),
            c.request.max_batch,
            c.step_rows
        ),
        Consts::Bert(_) => {
            format!("per encoder: activations {} (a full batch)", human_bytes(f.scratch_bytes))
        }
    };
    s.push_str(&format!(
        "memory: weights {} ({} parameters, {}, memory-mapped); {per_run}\n",
        human_bytes(f.weight_bytes),
        f.parameters,
        w.weights.dtype.as_str(),
    ));
    s.push_str(&format!("output: {}\n", shown(out_dir)));
    s
}
