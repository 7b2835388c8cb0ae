//! Resolution: workload + registry → [`Plan`].
//!
//! For each interface the architecture needs, every implementation is checked against the
//! workload's constraints (device, arch, CPU features, dtype, shapes), and each failed check
//! is kept as a reason. Among the compatible ones, shadowing removes those that another
//! compatible implementation declares it replaces. Of the rest, where the workload names a
//! hardware class, the fastest fresh measurement wins (the incumbent keeps its place unless
//! [`crate::rankings::judge`] says otherwise); otherwise the declared priority ranks them (then the
//! name, so that the result never depends on file-system order). Resolution is
//! the only stage that rejects a workload for semantic reasons beyond its own file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cpu;
use crate::diagnostics::Diagnostic;
use crate::plan::{
    BertConsts, Candidate, Chosen, Consts, Footprint, InterfacePlan, LlamaConsts, Plan, Verdict, human_ns,
};
use crate::rankings::{self, Distribution, Evidence, Rankings};
use crate::registry::{Implementation, Registry, sha256_hex};
use crate::workload::{Dtype, Model, Pooling, Workload};

/// The interfaces a workload's forward pass calls, in the order it calls them. Options the
/// workload does not use (no pooling, no normalization) need no interface, so their code is
/// never generated. The workload's element types pick each interface's element type
/// ([`Workload::element_types`]).
pub fn required_interfaces(w: &Workload) -> Vec<&'static str> {
    let mut list = architecture_interfaces(w);
    // A speculator left to measurement may be chosen: its sources matter to the workload. A
    // draft model is a crate of its own, generated beside the target, not a kernel.
    if w.speculation
        .as_ref()
        .is_some_and(|s| s.speculates() && s.speculator != crate::workload::Speculator::DraftModel)
    {
        list.push("speculator");
    }
    list
}

/// The interfaces of the workload's architecture and its options.
fn architecture_interfaces(w: &Workload) -> Vec<&'static str> {
    match &w.model {
        // With a sliding window, every row of a CPU crate attends through attention_decode over
        // its own window of the cache, and no prefill attention is generated (a CUDA crate's
        // attentions take the window as a constant of their source).
        Model::Llama(m) if m.sliding_window.is_some() && w.target.device == crate::workload::Device::Cpu => {
            vec!["rmsnorm", "matmul", "rope", "kv_cache", "attention_decode", "swiglu", "sampler"]
        }
        Model::Llama(_) => vec![
            "rmsnorm",
            "matmul",
            "rope",
            "kv_cache",
            "attention_prefill",
            "attention_decode",
            "swiglu",
            "sampler",
        ],
        Model::Bert(m) => {
            let mut list = vec!["embedding", "layernorm", "matmul", "attention_encoder", "gelu"];
            if m.pooling == Pooling::Mean {
                list.push("mean_pooling");
            }
            if m.normalize {
                list.push("l2_normalize");
            }
            list
        }
    }
}

/// The values of the shape parameters that manifests constrain, by name.
pub fn shape_parameters(w: &Workload) -> BTreeMap<&'static str, usize> {
    w.shapes().into_iter().map(|(shape, value)| (shape.name(), value)).collect()
}

/// Why `imp` cannot serve `w`; empty when it can.
pub fn rejections(imp: &Implementation, w: &Workload) -> Vec<String> {
    let c = &imp.constraints;
    let mut reasons = Vec::new();
    if let Some(devices) = &c.devices
        && !devices.contains(&w.target.device)
    {
        let list: Vec<&str> = devices.iter().map(|d| d.as_str()).collect();
        reasons.push(format!(
            "runs on {}; the workload targets {} (target.device)",
            list.join(", "),
            w.target.device.as_str()
        ));
    }
    if let Some(arches) = &c.arches
        && !arches.contains(&w.target.arch)
    {
        reasons.push(format!(
            "compiles for {} only; the workload targets {} (target.arch)",
            arches.join(", "),
            w.target.arch
        ));
    }
    let missing: Vec<&str> =
        c.cpu_features.iter().filter(|f| !w.target.cpu_features.contains(f)).map(String::as_str).collect();
    if !missing.is_empty() {
        reasons.push(format!(
            "needs CPU feature{} {}, which target.cpu_features does not list",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", ")
        ));
    }
    if let Some(dtypes) = &c.dtypes
        && !dtypes.contains(&w.weights.dtype)
    {
        let list: Vec<&str> = dtypes.iter().map(|d| d.as_str()).collect();
        reasons.push(format!(
            "supports weight dtype {}; the workload uses {} (weights.dtype)",
            list.join(", "),
            w.weights.dtype.as_str()
        ));
    }
    let types = w.element_types();
    let other: Vec<String> = imp
        .elements
        .iter()
        .filter(|(k, v)| types.get(k.as_str()) != Some(&v.as_str()))
        .map(|(k, v)| {
            format!("{k} = {v} where the workload has {}", types.get(k.as_str()).unwrap_or(&"none"))
        })
        .collect();
    if !other.is_empty() {
        reasons.push(format!("takes other element types: {}", other.join(", ")));
    }
    let shapes = shape_parameters(w);
    for (name, bound) in &c.shapes {
        if let Some(&value) = shapes.get(name.as_str())
            && let Some(why) = bound.violation(value)
        {
            reasons.push(format!("needs {name} {}: the workload's {name} {why}", describe_bound(bound)));
        }
    }
    reasons
}

fn describe_bound(b: &crate::registry::ShapeBound) -> String {
    let mut parts = Vec::new();
    if let Some(m) = b.min {
        parts.push(format!(">= {m}"));
    }
    if let Some(m) = b.max {
        parts.push(format!("<= {m}"));
    }
    if let Some(m) = b.multiple_of {
        parts.push(format!("a multiple of {m}"));
    }
    parts.join(", ")
}

/// What resolution knows beyond the workload and the registry: the ranking database and
/// the choices of the crate generated before (the incumbents, which keep their place unless
/// a challenger is faster beyond the noise). Both are repository contents.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub rankings: Rankings,
    /// Interface → implementation chosen by the previous generation (from its monogen.lock).
    pub incumbents: BTreeMap<String, String>,
    /// Interface → implementation to choose whatever the rankings say, where it is a valid
    /// competitor: how `bench` builds a crate both ways to confirm a flip end to end.
    pub forced: BTreeMap<String, String>,
    /// Why the `forced` choices are made, as the plan says it (default: `bench`'s end-to-end
    /// check of a flip).
    pub forced_because: Option<String>,
}

/// Resolves `w` against `registry`. `path` is the workload file, for error messages.
pub fn resolve(
    w: &Workload,
    registry: &Registry,
    selection: &Selection,
    path: &Path,
) -> Result<Plan, Vec<Diagnostic>> {
    // A speculator left to measurement is chosen first; the crate is then resolved as if the
    // workload named the choice (the plan keeps the workload as written, and why).
    let original = w;
    let decision = crate::speculation::decide(w, &selection.rankings, registry);
    let decided;
    let w = match &decision {
        Some(d) => {
            decided = Workload { speculation: d.chosen.clone(), ..w.clone() };
            &decided
        }
        None => w,
    };
    let mut problems = Vec::new();
    let mut interfaces = Vec::new();
    for name in required_interfaces(w) {
        let Some(interface) = registry.interfaces.get(name) else {
            problems.push(
                Diagnostic::new(format!(
                    "the registry has no interface `{name}`, which the {} architecture needs",
                    w.model.architecture().as_str()
                ))
                .hint(format!("add interfaces/{name}.toml")),
            );
            continue;
        };
        let element = match interface.element_for(&w.element_types()) {
            Ok(element) => element,
            Err(why) => {
                problems.push(
                    Diagnostic::new(format!("no element type of `{name}` fits workload `{}`: {why}", w.name))
                        .at_path(path)
                        .hint("change the workload's dtypes to one the interface takes (weights.dtype, weights.activations, kv_cache.dtype), or add the element type to the interface"),
                );
                continue;
            }
        };
        // Implementations of other element types never compete, and explain does not list them.
        let imps: Vec<Implementation> = registry
            .implementations_of(name)
            .iter()
            .filter(|i| i.element.as_deref() == element.map(|e| e.name.as_str()))
            .cloned()
            .collect();
        match choose(name, &imps, w, registry, selection) {
            Ok((chosen, candidates, unmeasured)) => interfaces.push(InterfacePlan {
                interface: name.to_string(),
                role: None,
                summary: interface.summary.clone(),
                element: element.map(|e| e.name.clone()),
                takes: element.map(|e| e.takes.clone()).unwrap_or_default(),
                reference: interface.reference_of(element).to_string(),
                chosen,
                candidates,
                competitors: competitors(&imps, w).into_iter().map(|i| i.name.clone()).collect(),
                unmeasured,
            }),
            Err(candidates) => {
                let mut d =
                    Diagnostic::new(format!("no implementation of `{name}` fits workload `{}`", w.name))
                        .at_path(path);
                if candidates.is_empty() {
                    d = d.note(format!("implementations/{name}/ holds no implementation"));
                }
                for c in &candidates {
                    match &c.verdict {
                        Verdict::Rejected { reasons } => {
                            d = d.note(format!("{name}/{}: {}", c.name, reasons.join("; ")))
                        }
                        Verdict::Failed { failure } => {
                            d = d.note(format!("{name}/{}: failed against the reference: {failure}", c.name))
                        }
                        _ => {}
                    }
                }
                problems.push(d.hint("change the workload's target or dtype, or add an implementation that supports it (see `monogen explain`)"));
            }
        }
    }
    if let (Some(dtype), Model::Llama(_)) = (w.weights.classifier(), &w.model) {
        match classifier_matmul(w, dtype, registry, path) {
            Ok(Some(plan)) => interfaces.push(plan),
            Ok(None) => {}
            Err(d) => problems.push(*d),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }

    let cpu_features: BTreeSet<&str> =
        interfaces.iter().flat_map(|i| i.chosen.cpu_features.iter().map(String::as_str)).collect();
    let cpu_features: Vec<String> =
        cpu::X86_64_FEATURES.iter().filter(|f| cpu_features.contains(*f)).map(|f| f.to_string()).collect();
    let shared_modules: BTreeSet<String> =
        interfaces.iter().flat_map(|i| i.chosen.shared.iter().cloned()).collect();
    let mut consts = consts(w);
    let mut footprint = footprint(w, &consts);
    if let Consts::Llama(c) = &mut consts
        && let Some(spec) = &mut c.speculation
        && let Some(draft) = w
            .speculation
            .as_ref()
            .filter(|s| s.speculator == crate::workload::Speculator::DraftModel)
            .and_then(|s| s.draft.as_deref())
    {
        let plan = draft_plan(w, draft, registry, selection, path)?;
        footprint.weight_bytes += plan.footprint.weight_bytes;
        footprint.kv_cache_bytes += plan.footprint.kv_cache_bytes;
        footprint.scratch_bytes += plan.footprint.scratch_bytes;
        spec.draft = Some(Box::new(plan));
    }
    if let Consts::Llama(c) = &mut consts {
        c.speculation_measured = decision.map(|d| Box::new(d.into()));
        // Int8 and int4 matrices quantized at load are copies in anonymous memory already, and so are
        // the matrices of a matmul that packs its weights. Int8 matrices saved with
        // `--save-model` stay mapped: a TinyLlama int8 crate decoded as fast from the mapping
        // as from a copy (1.007x, 6 rounds), which cost 2.2 s of load (bench/RESULTS.md).
        let packed = crate::plan::matmul_packs_weights(&interfaces);
        c.resident_weights = !matches!(w.weights.dtype, Dtype::Int8 | Dtype::Int4)
            && w.weights.classifier().is_none()
            && !packed
            && footprint.weight_bytes >= RESIDENT_WEIGHT_BYTES;
    }
    Ok(Plan {
        name: w.name.clone(),
        description: w.description.clone().unwrap_or_else(|| {
            format!(
                "{} inference for workload {}, generated by monogen",
                w.model.architecture().as_str(),
                w.name
            )
        }),
        weights: w.weights.clone(),
        target: w.target.clone(),
        workload_table: toml::Table::try_from(original).expect("a workload always serializes"),
        workload_file: original.source.0.as_deref().map_or_else(|| original.canonical_toml(), str::to_string),
        float_literals: match &w.model {
            Model::Llama(m) => BTreeMap::from([
                ("rope_theta".to_string(), format!("{:?}", m.rope_theta)),
                ("rms_norm_eps".to_string(), format!("{:?}", m.rms_norm_eps)),
            ]),
            Model::Bert(m) => {
                BTreeMap::from([("layer_norm_eps".to_string(), format!("{:?}", m.layer_norm_eps))])
            }
        },
        workload_sha256: sha256_hex(original.canonical_toml().as_bytes()),
        shapes: rankings::shapes_signature(w),
        consts,
        interfaces,
        cpu_features,
        shared_modules: shared_modules.into_iter().collect(),
        footprint,
    })
}

/// The workload of `w`'s draft model: `draft`'s model and weights on `w`'s target, one
/// sequence at a time up to `w`'s longest, named `<name>-draft`.
pub fn draft_workload(w: &Workload, draft: &crate::workload::Draft) -> Workload {
    let request = match &w.request {
        crate::workload::Request::Decoder(r) => {
            crate::workload::Request::Decoder(crate::workload::DecoderRequest {
                max_batch: 1,
                shared_prefix_len: None,
                ..r.clone()
            })
        }
        other => other.clone(),
    };
    Workload {
        name: format!("{}-draft", w.name),
        description: Some(format!("the draft model of {}, which drafts the tokens it verifies", w.name)),
        model: Model::Llama(draft.model.clone()),
        weights: draft.weights.clone(),
        request,
        serving: None,
        quality: None,
        speculation: None,
        source: Default::default(),
        ..w.clone()
    }
}

/// The plan of `w`'s draft model (see [`draft_workload`]), resolved as a crate of its own
/// whose sessions rewind; its problems are the workload's, each saying it is the draft's.
fn draft_plan(
    w: &Workload,
    draft: &crate::workload::Draft,
    registry: &Registry,
    selection: &Selection,
    path: &Path,
) -> Result<Plan, Vec<Diagnostic>> {
    let dw = draft_workload(w, draft);
    let selection = Selection { rankings: selection.rankings.clone(), ..Selection::default() };
    let mut plan = resolve(&dw, registry, &selection, path).map_err(|problems| {
        problems
            .into_iter()
            .map(|mut d| {
                d.message = format!("the draft model ([speculation.draft]): {}", d.message);
                d
            })
            .collect::<Vec<_>>()
    })?;
    if let Consts::Llama(c) = &mut plan.consts {
        c.drafts = true;
    }
    Ok(plan)
}

/// The classifier's own `matmul` where `weights.classifier_dtype` holds the classifier as
/// `dtype`: the compatible kernels of that element type that read the matrix as it is loaded
/// (a kernel that packs its weights would need the embedding rows kept apart, which the crate
/// does not do), chosen by declared priority: `monogen bench` times the products of the
/// workload's own `matmul`, not the classifier's apart. `None` where the registry has no
/// `matmul` (the loop over the interfaces has said so).
fn classifier_matmul(
    w: &Workload,
    dtype: Dtype,
    registry: &Registry,
    path: &Path,
) -> Result<Option<InterfacePlan>, Box<Diagnostic>> {
    let name = "matmul";
    let Some(interface) = registry.interfaces.get(name) else { return Ok(None) };
    // The workload as the classifier sees it: its matrix's element type, no hardware class.
    let mut view = w.clone();
    view.weights =
        crate::workload::Weights { dtype, activations: w.weights.activations, classifier_dtype: None };
    view.target.hardware = None;
    let element = interface.element_for(&view.element_types()).map_err(|why| {
        Box::new(
            Diagnostic::new(format!(
            "no element type of `matmul` fits the classifier of workload `{}` (weights.classifier_dtype = \"{}\"): {why}",
            w.name,
            dtype.as_str()
        ))
        .at_path(path)
        .hint("name another weights.classifier_dtype, or remove it")
        )
    })?;
    let element_name = element.map(|e| e.name.clone());
    let (imps, packing): (Vec<Implementation>, Vec<Implementation>) = registry
        .implementations_of(name)
        .iter()
        .filter(|i| i.element == element_name)
        .cloned()
        .partition(|i| !i.packs_weights);
    let shown = element_name.as_deref().map_or_else(|| name.to_string(), |e| format!("{name}<{e}>"));
    let (mut chosen, mut candidates, _) = match choose(name, &imps, &view, registry, &Selection::default()) {
        Ok(choice) => choice,
        Err(candidates) => {
            let mut d = Diagnostic::new(format!(
                "no implementation of `{shown}` fits the classifier of workload `{}`",
                w.name
            ))
            .at_path(path);
            for c in &candidates {
                if let Verdict::Rejected { reasons } = &c.verdict {
                    d = d.note(format!("{name}/{}: {}", c.name, reasons.join("; ")));
                }
            }
            return Err(d
                .hint("name another weights.classifier_dtype, or change the workload's target")
                .into());
        }
    };
    let module = crate::plan::role_module(name, Some(crate::plan::CLASSIFIER));
    let compatible = candidates.iter().filter(|c| !matches!(c.verdict, Verdict::Rejected { .. })).count();
    let priority = imps.iter().find(|i| i.name == chosen.name).map_or(0, |i| i.priority);
    chosen.reason = format!(
        "highest declared priority ({priority}) among {compatible} compatible `{shown}` kernels that read the classifier as loaded: `monogen bench` times the other products' `matmul`, not the classifier's apart"
    );
    chosen.basis =
        "highest declared priority for the classifier's product, which is not timed apart".to_string();
    chosen.team_job = imps.iter().find(|i| i.name == chosen.name).and_then(|i| i.team_job_path(&module));
    for c in &mut candidates {
        match &mut c.verdict {
            Verdict::Chosen { reason } => *reason = chosen.reason.clone(),
            Verdict::Outranked { reason, basis, .. } => {
                *reason = format!("declared priority {} below the chosen one's", c.priority);
                *basis = reason.clone();
            }
            _ => {}
        }
    }
    candidates.extend(packing.iter().map(|i| Candidate {
        name: i.name.clone(),
        version: i.version.clone(),
        priority: i.priority,
        verdict: Verdict::Rejected {
            reasons: rejections(i, &view)
                .into_iter()
                .chain(["packs its weights at load, and the classifier's kernel reads its matrix as loaded (the embedding rows too, where they are tied)".to_string()])
                .collect(),
        },
        evidence: None,
    }));
    Ok(Some(InterfacePlan {
        interface: name.to_string(),
        role: Some(crate::plan::CLASSIFIER.to_string()),
        summary: interface.summary.clone(),
        element: element_name,
        takes: element.map(|e| e.takes.clone()).unwrap_or_default(),
        reference: interface.reference_of(element).to_string(),
        chosen,
        candidates,
        competitors: competitors(&imps, &view).into_iter().map(|i| i.name.clone()).collect(),
        unmeasured: Vec::new(),
    }))
}

/// The compatible implementations of an interface that compete for `w` (not shadowed by
/// another compatible one), in declared-priority order.
pub fn competitors<'r>(imps: &'r [Implementation], w: &Workload) -> Vec<&'r Implementation> {
    let compatible: Vec<&Implementation> = imps.iter().filter(|i| rejections(i, w).is_empty()).collect();
    let mut ranked: Vec<&Implementation> = compatible
        .iter()
        .copied()
        .filter(|imp| !compatible.iter().any(|other| other.shadows.contains(&imp.name)))
        .collect();
    ranked.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(&b.name)));
    ranked
}

type Choice = (Chosen, Vec<Candidate>, Vec<String>);

/// Picks one implementation; on failure returns every candidate with its verdict.
///
/// Among the competitors that did not fail against the reference: with fresh measurements,
/// the fastest (an incumbent keeps its place unless [`rankings::beats`] says otherwise);
/// without, the highest declared priority.
fn choose(
    interface: &str,
    imps: &[Implementation],
    w: &Workload,
    registry: &Registry,
    selection: &Selection,
) -> Result<Choice, Vec<Candidate>> {
    let reasons: Vec<Vec<String>> = imps.iter().map(|i| rejections(i, w)).collect();
    let field = Field::new(interface, imps, &reasons, w, registry, selection);
    let unmeasured = field.unmeasured(w);
    let basis = field.basis();
    // (winner, reason) and, for losers, the reason they lost.
    let forced =
        selection.forced.get(interface).and_then(|name| field.valid.iter().find(|i| &i.name == name));
    let (winner, reason) = if let Some(forced) = forced {
        (
            Some(*forced),
            selection.forced_because.clone().unwrap_or_else(|| {
                "chosen by `monogen bench` to time the crate both ways (a flip's end-to-end check)"
                    .to_string()
            }),
        )
    } else if field.valid.len() <= 1 {
        field.only_candidate()
    } else if field.measured.is_empty() {
        field.highest_priority()
    } else {
        let (winner, reason) = field.fastest_measured(selection, registry);
        (Some(winner), reason)
    };
    let candidates: Vec<Candidate> = imps
        .iter()
        .zip(reasons)
        .map(|(imp, reasons)| field.candidate(imp, reasons, winner, &reason))
        .collect();
    match winner {
        Some(win) => {
            let candidates_sha256 = field.candidates_sha256(registry);
            Ok((chosen(win, interface, registry, reason, basis, candidates_sha256), candidates, unmeasured))
        }
        None => Err(candidates),
    }
}

/// The implementations of one interface as [`choose`] sees them for a workload: which are
/// compatible, the evidence of the competitors, which of them are valid (did not fail against
/// the reference) and which of those have fresh measurements.
struct Field<'a> {
    interface: &'a str,
    /// The implementations that no constraint rejects.
    compatible: Vec<&'a Implementation>,
    /// The evidence of each competitor, by name.
    evidence: BTreeMap<&'a str, Evidence>,
    /// The competitors that did not fail against the reference, in declared-priority order.
    valid: Vec<&'a Implementation>,
    /// The valid competitors with fresh measurements, with their distributions.
    measured: Vec<(&'a Implementation, Distribution)>,
    /// How packing at load counts in the times compared, where it does.
    counted: Option<String>,
    /// `counted` in parentheses, with a space before; empty where packing does not count.
    in_parentheses: String,
    /// The workload's hardware class.
    class: Option<&'a str>,
    /// Where a batched decoder's row-batched interface is ranked by records of one row per
    /// decode step (none at its batch yet on its class): the words that say so.
    at_one_row: Option<String>,
    /// The workload's shape signature, which confirmations are keyed by.
    shapes: String,
    /// How many competitors failed against the reference.
    failed: usize,
    /// `failed` in parentheses, with a space before; empty where none failed.
    failed_note: String,
}

impl<'a> Field<'a> {
    /// The registry's revision as this choice saw it: sha256 of the name, version and sources
    /// (kernel and shared modules, as a ranking record keys them) of every compatible
    /// implementation, by name. An implementation added, removed or edited changes it; one that
    /// the workload's constraints reject does not.
    fn candidates_sha256(&self, registry: &Registry) -> String {
        let mut lines: Vec<String> = self
            .compatible
            .iter()
            .map(|i| {
                format!("{} {} {}\n", i.name, i.version, crate::rankings::measured_source_sha256(i, registry))
            })
            .collect();
        lines.sort();
        sha256_hex(lines.concat().as_bytes())
    }

    /// The field of `imps` for `w`; `reasons` holds each implementation's rejections.
    fn new(
        interface: &'a str,
        imps: &'a [Implementation],
        reasons: &[Vec<String>],
        w: &'a Workload,
        registry: &Registry,
        selection: &Selection,
    ) -> Field<'a> {
        let compatible: Vec<&Implementation> =
            imps.iter().zip(reasons).filter(|(_, r)| r.is_empty()).map(|(i, _)| i).collect();
        let ranked = competitors(imps, w);
        let evidence: BTreeMap<&str, Evidence> = ranked
            .iter()
            .map(|i| i.name.as_str())
            .zip(rankings::evidence(&selection.rankings, registry, interface, &ranked, w))
            .collect();
        let valid: Vec<&Implementation> = ranked
            .iter()
            .copied()
            .filter(|i| !matches!(evidence[i.name.as_str()], Evidence::Failed(_)))
            .collect();
        let measured: Vec<(&Implementation, Distribution)> = valid
            .iter()
            .filter_map(|i| evidence[i.name.as_str()].fresh_distribution().map(|d| (*i, d)))
            .collect();
        // Where the workload counts the load and a measured candidate packs at load, the times
        // compared include each request's share of it.
        let packing = measured.iter().any(|(i, _)| i.packs_weights);
        let counted = match w.request.requests_per_load().filter(|_| packing) {
            Some(1) => Some("packing at load counted in full".to_string()),
            Some(n) => Some(format!("packing at load counted over {n} requests")),
            None => None,
        };
        let in_parentheses = counted.as_ref().map(|c| format!(" ({c})")).unwrap_or_default();
        let failed = ranked.len() - valid.len();
        let failed_note =
            if failed > 0 { format!(" ({failed} failed against the reference)") } else { String::new() };
        let at_one_row = w
            .target
            .hardware
            .as_deref()
            .filter(|class| rankings::records_shapes(&selection.rankings, class, interface, w).1)
            .map(|_| {
                format!(
                    ", at one row per decode step: not yet at this workload's batch of {} (`monogen bench` measures it)",
                    w.decode_batch()
                )
            });
        Field {
            interface,
            compatible,
            at_one_row,
            evidence,
            valid,
            measured,
            counted,
            in_parentheses,
            class: w.target.hardware.as_deref(),
            shapes: rankings::shapes_signature(w),
            failed,
            failed_note,
        }
    }

    /// Why the valid competitors that should have fresh measurements have none: one line each,
    /// missing or stale. Empty where the workload needs no measurements.
    fn unmeasured(&self, w: &Workload) -> Vec<String> {
        let interface = self.interface;
        let mut unmeasured = Vec::new();
        if rankings::needs_measurements(w, self.valid.len()) {
            let class = self.class.unwrap_or_default();
            for imp in &self.valid {
                match &self.evidence[imp.name.as_str()] {
                    Evidence::Missing => unmeasured.push(format!(
                        "{interface}/{} has not been measured on {class} at this workload's shapes",
                        imp.name
                    )),
                    Evidence::Stale { why, .. } => unmeasured.push(format!(
                        "{interface}/{}'s measurements on {class} are stale: {}",
                        imp.name,
                        why.join("; ")
                    )),
                    _ => {}
                }
            }
        }
        unmeasured
    }

    /// Why the winner won, in words that do not change when the same ranking is measured again.
    fn basis(&self) -> String {
        if self.valid.len() <= 1 {
            "the only candidate".to_string()
        } else if self.measured.is_empty() {
            "highest declared priority (not measured)".to_string()
        } else {
            format!(
                "fastest measured on {} (rankings/{}/{}.toml){}",
                self.class.unwrap_or_default(),
                self.class.unwrap_or_default(),
                self.interface,
                self.at_one_row.as_deref().unwrap_or_default()
            )
        }
    }

    /// The winner and its reason where at most one candidate is valid (no winner where none is).
    fn only_candidate(&self) -> (Option<&'a Implementation>, String) {
        let failed_note = &self.failed_note;
        let only = self.valid.first().copied();
        // `kv_cache<bf16>`: the only one of its element type.
        let interface = match only.and_then(|i| i.element.as_deref()) {
            Some(element) => format!("{}<{element}>", self.interface),
            None => self.interface.to_string(),
        };
        let reason = if self.compatible.len() > 1 && self.failed == 0 {
            format!("the only compatible implementation of `{interface}` that no other replaces")
        } else {
            format!("the only implementation of `{interface}` that fits this workload{failed_note}")
        };
        (only, reason)
    }

    /// The winner and its reason where several candidates are valid and none is measured: the
    /// highest declared priority.
    fn highest_priority(&self) -> (Option<&'a Implementation>, String) {
        let win = self.valid[0];
        let why = match self.class {
            None => {
                "the workload names no hardware class (target.hardware), so nothing is measured".to_string()
            }
            Some(class) => format!("no fresh measurements on {class}; `monogen bench` makes them"),
        };
        (
            Some(win),
            format!(
                "highest declared priority ({}) among {} compatible implementations{}: {why}",
                win.priority,
                self.valid.len(),
                self.failed_note
            ),
        )
    }

    /// The winner and its reason where several candidates are valid and some are measured: the
    /// fastest, unless the incumbent of `selection` is within the noise of it; but a measured
    /// candidate that the crate, built with it and with that choice, ran faster end to end
    /// (`bench --verify`'s confirmation) takes its place.
    fn fastest_measured(&self, selection: &Selection, registry: &Registry) -> (&'a Implementation, String) {
        let (win, reason) = self.fastest_by_kernels(selection, registry);
        let class = self.class.unwrap_or_default();
        let confirmed = |from: &Implementation, to: &Implementation| {
            selection
                .rankings
                .confirmation(class, self.interface, &self.shapes, from, to, registry)
                .filter(|c| c.confirmed)
        };
        let faster = self.measured.iter().filter(|(i, _)| i.name != win.name).find_map(|(other, _)| {
            let c = confirmed(win, other)?;
            // unless a later check of the way back found the kernels' choice faster again
            let back = confirmed(other, win).filter(|b| b.measured_at > c.measured_at);
            back.is_none().then_some((*other, c))
        });
        match faster {
            Some((other, c)) => (
                other,
                format!(
                    "faster end to end on {class} than {}, which the kernels' records chose ({reason}): the crate built with it ran {}",
                    win.name,
                    crate_figure(c)
                ),
            ),
            None => (win, reason),
        }
    }

    /// [`Field::fastest_measured`] by the kernels' records and the flips' confirmations alone.
    fn fastest_by_kernels(&self, selection: &Selection, registry: &Registry) -> (&'a Implementation, String) {
        let (measured, in_parentheses, failed_note) =
            (&self.measured, &self.in_parentheses, &self.failed_note);
        let fastest = measured
            .iter()
            .min_by(|a, b| a.1.median_ns.total_cmp(&b.1.median_ns))
            .copied()
            .expect("measured is not empty");
        let incumbent = selection
            .incumbents
            .get(self.interface)
            .and_then(|name| measured.iter().find(|(i, _)| &i.name == name))
            .copied();
        let class = self.class.unwrap_or_default();
        let record = |imp: &Implementation| match &self.evidence[imp.name.as_str()] {
            Evidence::Measured(r) => r,
            _ => unreachable!("a measured candidate has a fresh record"),
        };
        let verdict = incumbent.map(|inc| rankings::judge(record(fastest.0), record(inc.0)));
        let by = |v: &rankings::Verdict| {
            if v.paired_rounds > 0 {
                format!("{:.3}x its time round by round over {} rounds", v.ratio, v.paired_rounds)
            } else {
                format!("{:.3}x its median", v.ratio)
            }
        };
        // A flip that the crate, built both ways and timed end to end, did not confirm.
        let confirmation = incumbent.filter(|inc| inc.0.name != fastest.0.name).and_then(|inc| {
            selection.rankings.confirmation(class, self.interface, &self.shapes, inc.0, fastest.0, registry)
        });
        let refuted = confirmation.filter(|c| !c.confirmed);
        match (incumbent, verdict) {
            (Some(inc), Some(v)) if inc.0.name != fastest.0.name && (!v.beats || refuted.is_some()) => {
                let why = match refuted {
                    Some(c) if v.beats => format!(
                        "beyond the noise margin ({:.0}%), but the crate built with it was not faster end to end: {}",
                        100.0 * v.margin,
                        crate_figure(c)
                    ),
                    _ => format!("a difference inside the noise margin ({:.0}%)", 100.0 * v.margin),
                };
                (
                    inc.0,
                    format!(
                        "measured {} per request on {class}{in_parentheses}; {} measured {} ({}), {why}, so the previous choice stays",
                        human_ns(inc.1.median_ns),
                        fastest.0.name,
                        human_ns(fastest.1.median_ns),
                        by(&v),
                    ),
                )
            }
            _ => {
                let runner_up = measured
                    .iter()
                    .filter(|(i, _)| i.name != fastest.0.name)
                    .min_by(|a, b| a.1.median_ns.total_cmp(&b.1.median_ns));
                let versus = match runner_up {
                    Some((r, d)) => format!(
                        ", {:.2}x faster than {} ({})",
                        d.median_ns / fastest.1.median_ns,
                        r.name,
                        human_ns(d.median_ns)
                    ),
                    None => String::new(),
                };
                let replaced = match (incumbent, verdict) {
                    (Some(inc), Some(v)) if inc.0.name != fastest.0.name => format!(
                        "; it replaces {} ({}), beyond the noise margin ({:.0}%){}",
                        inc.0.name,
                        by(&v),
                        100.0 * v.margin,
                        match confirmation {
                            Some(c) => format!(", confirmed by the crate end to end: {}", crate_figure(c)),
                            None => String::new(),
                        }
                    ),
                    _ => String::new(),
                };
                let load = self.counted.as_ref().map(|c| format!(", {c}")).unwrap_or_default();
                (
                    fastest.0,
                    format!(
                        "fastest measured on {class}: {} per request (p90 +{:.0}%, {} samples{load}){versus}{replaced}{failed_note}",
                        human_ns(fastest.1.median_ns),
                        100.0 * fastest.1.relative_spread(),
                        fastest.1.samples
                    ),
                )
            }
        }
    }

    /// `imp` with its verdict: rejected for `reasons` (its rejections), shadowed, failed
    /// against the reference, chosen (`winner`, for `reason`) or outranked by the winner.
    fn candidate(
        &self,
        imp: &Implementation,
        reasons: Vec<String>,
        winner: Option<&Implementation>,
        reason: &str,
    ) -> Candidate {
        let ev = self.evidence.get(imp.name.as_str()).cloned();
        let verdict = if !reasons.is_empty() {
            Verdict::Rejected { reasons }
        } else if let Some(by) = self.shadowed_by(imp) {
            Verdict::Shadowed { by }
        } else if let Some(Evidence::Failed(record)) = &ev {
            Verdict::Failed { failure: record.failure.clone().unwrap_or_else(|| "no reason recorded".into()) }
        } else if winner.is_some_and(|w| w.name == imp.name) {
            Verdict::Chosen { reason: reason.to_string() }
        } else {
            let win = winner.expect("a valid candidate implies a winner");
            self.outranked(imp, ev.as_ref(), win)
        };
        Candidate {
            name: imp.name.clone(),
            version: imp.version.clone(),
            priority: imp.priority,
            verdict,
            evidence: ev,
        }
    }

    /// The compatible implementation that declares it replaces `imp`, if one does.
    fn shadowed_by(&self, imp: &Implementation) -> Option<String> {
        self.compatible.iter().find(|other| other.shadows.contains(&imp.name)).map(|o| o.name.clone())
    }

    /// The verdict of a valid `imp` (with evidence `ev`) that `win` outranks: slower when both
    /// are measured, not ranked when only the winner is, lower declared priority otherwise.
    fn outranked(&self, imp: &Implementation, ev: Option<&Evidence>, win: &Implementation) -> Verdict {
        let in_parentheses = &self.in_parentheses;
        let mine = ev.and_then(Evidence::fresh_distribution);
        let theirs = self.measured.iter().find(|(i, _)| i.name == win.name).map(|(_, d)| *d);
        let loser_basis = match (mine, theirs) {
            (Some(_), Some(_)) => format!("slower when measured on {}", self.class.unwrap_or_default()),
            (_, Some(_)) => "not measured".to_string(),
            _ => "lower declared priority".to_string(),
        };
        let why = match (mine, theirs, ev) {
            (Some(m), Some(t), _) => format!(
                "measured {} per request, {:.2}x {}'s {}{in_parentheses}",
                human_ns(m.median_ns),
                m.median_ns / t.median_ns,
                win.name,
                human_ns(t.median_ns)
            ),
            (_, Some(_), Some(Evidence::Stale { why, .. })) => {
                format!("not ranked: its measurements are stale ({})", why.join("; "))
            }
            (_, Some(_), _) => {
                "not ranked: not measured at this workload's shapes on its hardware class".into()
            }
            _ => format!("declared priority {} is below {}'s {}", imp.priority, win.name, win.priority),
        };
        Verdict::Outranked { by: win.name.clone(), reason: why, basis: loser_basis }
    }
}

/// A confirmation's crate figures: the challenger's time per request against the incumbent's.
fn crate_figure(c: &rankings::Confirmation) -> String {
    let (from, to) = c.medians_ns();
    format!(
        "{} per request against {} ({:.3}x round by round over {} rounds, margin {:.0}%, {})",
        human_ns(to),
        human_ns(from),
        c.crate_ratio,
        c.to_rounds_ns.len(),
        100.0 * c.margin,
        c.measured_at
    )
}

/// The plan's record of `win`, the implementation chosen for `interface`, with why it won.
fn chosen(
    win: &Implementation,
    interface: &str,
    registry: &Registry,
    reason: String,
    basis: String,
    candidates_sha256: String,
) -> Chosen {
    Chosen {
        name: win.name.clone(),
        version: win.version.clone(),
        source_sha256: win.source_sha256.clone(),
        candidates_sha256,
        cpu_features: win.constraints.cpu_features.clone(),
        shared: win.shared.clone(),
        dependencies: win.dependencies.clone(),
        packs_weights: win.packs_weights,
        packing: win.packed_len.as_ref().map(|packed_len| crate::plan::Packing {
            packed_len: packed_len.clone(),
            layout: format!(
                "{interface}/{} {} sha256:{}",
                win.name,
                win.version,
                crate::rankings::measured_source_sha256(win, registry)
            ),
        }),
        team_job: win.team_job_path(interface),
        reason,
        basis,
    }
}

/// Weight bytes from which a LLaMA crate copies its weights into anonymous memory at load
/// instead of reading them through the file mapping, where the kernel maps less than three
/// quarters of the file in huge pages (`runtime/resident.rs` checks at load): far beyond any
/// cache, where a decode step streams every weight from DRAM, and measured about 30% faster
/// from anonymous memory than from a mapping in small pages (TinyLlama f32 on intel-xeon-2c:
/// 6.5-6.7 against 5.0-5.5 tokens/s, bench/RESULTS.md; stories110M's 438 MB showed no gain),
/// and as fast from a mapping in huge pages. Below it, the copy would only add to the load
/// time.
pub const RESIDENT_WEIGHT_BYTES: u64 = 1 << 30;

fn consts(w: &Workload) -> Consts {
    match &w.model {
        Model::Llama(m) => {
            let r = w.decoder();
            Consts::Llama(LlamaConsts {
                hidden_size: m.hidden_size,
                intermediate_size: m.intermediate_size,
                num_layers: m.num_layers,
                num_heads: m.num_heads,
                num_kv_heads: m.num_kv_heads,
                head_dim: m.head_dim,
                q_dim: m.num_heads * m.head_dim,
                kv_dim: m.num_kv_heads * m.head_dim,
                vocab_size: m.vocab_size,
                max_seq_len: r.max_seq_len,
                prefill_chunk: r.typical_prompt_len.min(r.max_seq_len),
                rope_theta: m.rope_theta as f32,
                rms_norm_eps: m.rms_norm_eps as f32,
                bos_token_id: m.bos_token_id,
                eos_token_ids: m.eos_token_ids.clone(),
                threads: w.target.threads,
                tie_word_embeddings: m.tie_word_embeddings,
                qkv_bias: m.qkv_bias,
                rope_scaling: m.rope_scaling,
                sliding_window: m.sliding_window,
                resident_weights: false,
                kv_dtype: w.kv_cache.dtype,
                request: r.clone(),
                step_rows: if r.max_batch > 1 || w.serving.is_some() {
                    r.typical_prompt_len.min(r.max_seq_len) + r.max_batch
                } else {
                    r.typical_prompt_len.min(r.max_seq_len)
                },
                serving: w.serving.as_ref().map(|s| crate::plan::ServingPlan {
                    priorities: s.priorities.clone(),
                    default_priority: s.default_priority().to_string(),
                    max_queue: s.max_queue,
                    kv_slots: s.kv_slots(r.max_batch),
                    max_body_bytes: s.max_body_bytes,
                    prefix_cache_min: r.shared_prefix_len.map(|n| n.div_ceil(2).max(1)),
                    chat: s.chat.clone().map(Box::new),
                }),
                speculation_measured: None,
                drafts: false,
                speculation: w.speculation.as_ref().and_then(|s| {
                    let speculator = match s.speculator {
                        crate::workload::Speculator::DraftModel => "draft-model",
                        other => other.implementation()?,
                    };
                    Some(Box::new(crate::plan::SpeculationPlan {
                        speculator: speculator.to_string(),
                        draft: None,
                        draft_tokens: s.draft_tokens,
                        lookup_max: s.lookup_max,
                        lookup_min: s.lookup_min,
                    }))
                }),
            })
        }
        Model::Bert(m) => {
            let r = w.encoder();
            Consts::Bert(BertConsts {
                hidden_size: m.hidden_size,
                intermediate_size: m.intermediate_size,
                num_layers: m.num_layers,
                num_heads: m.num_heads,
                head_dim: m.head_dim,
                vocab_size: m.vocab_size,
                type_vocab_size: m.type_vocab_size,
                max_position_embeddings: m.max_position_embeddings,
                max_seq_len: r.max_seq_len,
                max_batch: r.max_batch,
                layer_norm_eps: m.layer_norm_eps as f32,
                pooling: m.pooling,
                normalize: m.normalize,
                threads: w.target.threads,
                request: r.clone(),
                serving: w.serving.as_ref().map(|s| crate::plan::EmbeddingServingPlan {
                    max_queue: s.max_queue,
                    max_body_bytes: s.max_body_bytes,
                    batch_wait_ms: s.batch_wait_ms(),
                }),
            })
        }
    }
}

fn footprint(w: &Workload, consts: &Consts) -> Footprint {
    let f32_size = 4;
    // Only the matrices take the workload's dtype; norms and biases (and a BERT's embeddings)
    // stay f32.
    let weight_bytes =
        |matrices: u64, parameters: u64| w.weights.dtype.bytes(matrices) + (parameters - matrices) * f32_size;
    match consts {
        Consts::Llama(c) => {
            let (d, h, v, q, kv) = (
                c.hidden_size as u64,
                c.intermediate_size as u64,
                c.vocab_size as u64,
                c.q_dim as u64,
                c.kv_dim as u64,
            );
            let biases = if c.qkv_bias { q + 2 * kv } else { 0 };
            let layer_matrices = d * q + 2 * d * kv + q * d + 3 * d * h;
            let per_layer = layer_matrices + 2 * d + biases;
            let classifier = if c.tie_word_embeddings { 0 } else { v * d };
            let matrices = v * d + c.num_layers as u64 * layer_matrices + classifier;
            let parameters = matrices + c.num_layers as u64 * (per_layer - layer_matrices) + d;
            let (rows, batch) = (c.step_rows as u64, c.request.max_batch as u64);
            let kv_cache_bytes =
                2 * c.num_layers as u64 * c.max_seq_len as u64 * kv * w.kv_cache.dtype.size() as u64;
            // x, xb: [rows, HIDDEN_SIZE]; q, att: [rows, Q_DIM]; k, v: [rows, KV_DIM]; gate, up: [rows, INTERMEDIATE_SIZE];
            // scores: [MAX_SEQ_LEN]; logits: [MAX_BATCH, VOCAB_SIZE]
            let scratch = rows * (2 * d + 2 * q + 2 * kv + 2 * h) + c.max_seq_len as u64 + batch * v;
            // A classifier of its own element type (the embedding too, where tied).
            let weight_bytes = match w.weights.classifier() {
                Some(dtype) => weight_bytes(matrices - v * d, parameters - v * d) + dtype.bytes(v * d),
                None => weight_bytes(matrices, parameters),
            };
            Footprint {
                parameters,
                weight_bytes,
                kv_cache_bytes,
                kv_caches: c.serving.as_ref().map_or(batch, |s| s.kv_slots as u64),
                scratch_bytes: scratch * f32_size,
            }
        }
        Consts::Bert(c) => {
            let (d, h) = (c.hidden_size as u64, c.intermediate_size as u64);
            // q, k, v, o and the MLP's two matrices; their biases; two LayerNorms.
            let layer_matrices = 4 * d * d + 2 * d * h;
            let per_layer = layer_matrices + (4 * d + h + d) + 4 * d;
            let embeddings =
                (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) as u64 * d + 2 * d;
            let parameters = embeddings + c.num_layers as u64 * per_layer;
            let matrices = c.num_layers as u64 * layer_matrices;
            let rows = (c.max_batch * c.max_seq_len) as u64;
            // x, xb, q, k, v, att: [rows, HIDDEN_SIZE]; mlp: [rows, INTERMEDIATE_SIZE]; scores: [MAX_SEQ_LEN]
            let scratch = rows * (6 * d + h) + c.max_seq_len as u64;
            Footprint {
                parameters,
                weight_bytes: weight_bytes(matrices, parameters),
                kv_cache_bytes: 0,
                kv_caches: 0,
                scratch_bytes: scratch * f32_size,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Constraints, ShapeBound};
    use crate::workload::{Dtype, WorkloadSource};

    fn workload() -> Workload {
        WorkloadSource::from_text("w.toml", crate::workload::tests_support::GOOD).parse().unwrap()
    }

    fn imp(name: &str, priority: i64, constraints: Constraints, shadows: &[&str]) -> Implementation {
        Implementation {
            priority,
            shadows: shadows.iter().map(|s| s.to_string()).collect(),
            constraints,
            ..Implementation::for_tests("matmul", name)
        }
    }

    fn needs(features: &[&str]) -> Constraints {
        Constraints {
            arches: Some(vec!["x86_64".into()]),
            cpu_features: features.iter().map(|s| s.to_string()).collect(),
            ..Constraints::default()
        }
    }

    #[test]
    fn the_weights_dtype_and_activations_pick_the_element_type_of_matmul_in_both_architectures() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let registry = Registry::load(&root).unwrap();
        for (file, element) in [
            ("stories260k-cpu-f32", "f32"),
            ("stories260k-cpu-bf16", "bf16"),
            ("stories260k-cpu-bf16-bf16act", "bf16act"),
            ("stories260k-cpu-int8", "q8"),
            ("stories260k-cpu-int4", "q4"),
            ("all-minilm-l6-v2-cpu-f32", "f32"),
            ("all-minilm-l6-v2-cpu-bf16", "bf16"),
            ("all-minilm-l6-v2-cpu-int8", "q8"),
        ] {
            let path = root.join(format!("workloads/{file}.toml"));
            let w = WorkloadSource::read(&path).unwrap().parse().unwrap();
            let plan = resolve(&w, &registry, &Selection::default(), &path).unwrap();
            let matmul = plan.interfaces.iter().find(|i| i.interface == "matmul").unwrap();
            assert_eq!(matmul.element.as_deref(), Some(element), "{file}");
            // Only implementations of that element type compete (a folder of several at that
            // one), and its reference is theirs.
            for c in &matmul.candidates {
                let imp = registry.implementation("matmul", &c.name, Some(element));
                assert!(imp.is_some(), "{file}: {} does not take {element}", c.name);
            }
            let others: Vec<&str> = registry
                .implementations_of("matmul")
                .iter()
                .filter(|i| i.element.as_deref() != Some(element) && !i.several_elements)
                .map(|i| i.name.as_str())
                .collect();
            assert!(matmul.candidates.iter().all(|c| !others.contains(&c.name.as_str())), "{file}");
            assert_eq!(
                registry
                    .implementation("matmul", &matmul.reference, Some(element))
                    .unwrap()
                    .element
                    .as_deref(),
                Some(element)
            );
        }
    }

    #[test]
    fn a_classifier_dtype_gives_the_classifier_a_matmul_of_its_own_element_type() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let registry = Registry::load(&root).unwrap();
        let path = root.join("workloads/stories260k-cpu-int4-q8-classifier.toml");
        let w = WorkloadSource::read(&path).unwrap().parse().unwrap();
        let plan = resolve(&w, &registry, &Selection::default(), &path).unwrap();
        let main = plan.interface("matmul").unwrap();
        assert_eq!(
            (main.element.as_deref(), main.role.as_deref(), main.module()),
            (Some("q4"), None, "matmul".into())
        );
        let own = plan.classifier_matmul().unwrap();
        assert_eq!(own.element.as_deref(), Some("q8"));
        assert_eq!((own.module(), own.title()), ("matmul_classifier".into(), "matmul (classifier)".into()));
        // The q8 kernels that fit x86-64-v3 and read the matrix as loaded; the highest declared
        // priority of them wins, whatever the rankings hold.
        assert_eq!(own.chosen.name, "q8-avx2-threads");
        assert!(own.chosen.reason.contains("not the classifier's apart"), "{}", own.chosen.reason);
        assert!(!own.chosen.packs_weights && own.unmeasured.is_empty());
        assert_eq!(own.chosen.team_job.as_deref(), Some("matmul_classifier::Shared"));
        for c in &own.candidates {
            let imp = registry.implementation("matmul", &c.name, Some("q8")).unwrap();
            if imp.packs_weights {
                assert!(
                    matches!(&c.verdict, Verdict::Rejected { reasons } if reasons.iter().any(|r| r.contains("packs its weights"))),
                    "{}: {:?}",
                    c.name,
                    c.verdict
                );
            }
        }
        // Its CPU features and shared modules are the crate's too.
        assert!(plan.shared_modules.contains(&"avx2_q8".to_string()));
        // The footprint counts the tied embedding at 1.125 bytes a weight, the rest at 0.625.
        let int4_path = root.join("workloads/stories260k-cpu-int4.toml");
        let int4 = WorkloadSource::read(&int4_path).unwrap().parse().unwrap();
        let alone = resolve(&int4, &registry, &Selection::default(), &int4_path).unwrap();
        let embedding = 512 * 64;
        assert_eq!(
            plan.footprint.weight_bytes - alone.footprint.weight_bytes,
            Dtype::Int8.bytes(embedding) - Dtype::Int4.bytes(embedding)
        );
        assert!(alone.classifier_matmul().is_none());
    }

    #[test]
    fn a_bf16_kv_cache_picks_the_bf16_element_type_of_the_cache_and_attention_interfaces() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let registry = Registry::load(&root).unwrap();
        let f32_cache =
            WorkloadSource::from_text("w.toml", crate::workload::tests_support::GOOD).parse().unwrap();
        let text = format!("{}\n[kv_cache]\ndtype = \"bf16\"\n", crate::workload::tests_support::GOOD);
        let bf16_cache = WorkloadSource::from_text("w.toml", &text).parse().unwrap();
        for (w, element) in [(&f32_cache, "f32"), (&bf16_cache, "bf16")] {
            for name in ["kv_cache", "attention_prefill", "attention_decode"] {
                let found = registry.interfaces[name].element_for(&w.element_types()).unwrap();
                assert_eq!(found.map(|e| e.name.as_str()), Some(element), "{name}");
            }
            // The products stay f32: the cache's element type is the cache's alone.
            let matmul = registry.interfaces["matmul"].element_for(&w.element_types()).unwrap();
            assert_eq!(matmul.map(|e| e.name.as_str()), Some("f32"));
        }
        let (f32_bytes, bf16_bytes) = (
            footprint(&f32_cache, &consts(&f32_cache)).kv_cache_bytes,
            footprint(&bf16_cache, &consts(&bf16_cache)).kv_cache_bytes,
        );
        assert_eq!(bf16_bytes * 2, f32_bytes);
    }

    #[test]
    fn highest_priority_compatible_wins_and_reasons_are_kept() {
        let w = workload();
        let imps = vec![
            imp("avx2", 20, needs(&["avx2", "fma"]), &[]),
            imp("avx512", 30, needs(&["avx512f"]), &[]),
            imp("scalar", 0, Constraints::default(), &[]),
        ];
        let (chosen, candidates, _) =
            choose("matmul", &imps, &w, &Registry::default(), &Selection::default()).unwrap();
        assert_eq!(chosen.name, "avx2");
        assert!(chosen.reason.contains("highest declared priority (20) among 2"), "{}", chosen.reason);
        assert_eq!(
            candidates[1].verdict,
            Verdict::Rejected {
                reasons: vec!["needs CPU feature avx512f, which target.cpu_features does not list".into()]
            }
        );
        assert!(matches!(&candidates[2].verdict, Verdict::Outranked { by, .. } if by == "avx2"));
    }

    #[test]
    fn shadowing_removes_the_generic_candidate_even_at_higher_priority() {
        let w = workload();
        let imps = vec![
            imp("fast", 1, needs(&["avx2"]), &["generic"]),
            imp("generic", 5, Constraints::default(), &[]),
        ];
        let (chosen, candidates, _) =
            choose("matmul", &imps, &w, &Registry::default(), &Selection::default()).unwrap();
        assert_eq!(chosen.name, "fast");
        assert_eq!(candidates[1].verdict, Verdict::Shadowed { by: "fast".into() });
    }

    #[test]
    fn a_shadowing_candidate_that_does_not_fit_shadows_nothing() {
        let w = workload();
        let imps = vec![
            imp("fast", 1, needs(&["avx512f"]), &["generic"]),
            imp("generic", 0, Constraints::default(), &[]),
        ];
        let (chosen, _, _) =
            choose("matmul", &imps, &w, &Registry::default(), &Selection::default()).unwrap();
        assert_eq!(chosen.name, "generic");
    }

    #[test]
    fn dtype_and_shape_constraints_explain_themselves() {
        let mut w = workload();
        w.weights.dtype = Dtype::Bf16;
        let mut c = Constraints { dtypes: Some(vec![Dtype::F32]), ..Constraints::default() };
        c.shapes.insert("head_dim".into(), ShapeBound { multiple_of: Some(16), ..ShapeBound::default() });
        let reasons = rejections(&imp("x", 0, c, &[]), &w);
        assert_eq!(
            reasons,
            [
                "supports weight dtype f32; the workload uses bf16 (weights.dtype)",
                "needs head_dim a multiple of 16: the workload's head_dim is 8, not a multiple of 16",
            ]
        );
        let err = choose(
            "matmul",
            &[imp("x", 0, Constraints { dtypes: Some(vec![Dtype::F32]), ..Constraints::default() }, &[])],
            &w,
            &Registry::default(),
            &Selection::default(),
        );
        assert!(err.is_err());
    }

    #[test]
    fn the_registry_revision_of_a_choice_moves_with_its_compatible_candidates_only() {
        let w = workload();
        let hash = |imps: &[Implementation]| {
            choose("matmul", imps, &w, &Registry::default(), &Selection::default())
                .unwrap()
                .0
                .candidates_sha256
        };
        let imps = vec![
            imp("fast", 1, needs(&["avx2"]), &[]),
            imp("generic", 0, Constraints::default(), &[]),
            imp("wide", 2, needs(&["avx512f"]), &[]),
        ];
        let before = hash(&imps);
        // A competitor that did not win, edited: the choice is the same, its revision is not.
        let mut edited = imps.clone();
        edited[1].source_sha256 = "edited".into();
        assert_eq!(
            choose("matmul", &edited, &w, &Registry::default(), &Selection::default()).unwrap().0.name,
            "fast"
        );
        assert_ne!(hash(&edited), before, "an edited competitor");
        let mut bumped = imps.clone();
        bumped[1].version = "2.0.0".into();
        assert_ne!(hash(&bumped), before, "a competitor's new version");
        let mut added = imps.clone();
        added.push(imp("newer", 0, Constraints::default(), &[]));
        assert_ne!(hash(&added), before, "a competitor added");
        assert_ne!(hash(&imps[..2]), hash(&[imps[0].clone()]), "a competitor removed");
        // One the workload's CPU rejects, edited or removed: nothing this crate chose from.
        let mut rejected = imps.clone();
        rejected[2].source_sha256 = "edited".into();
        assert_eq!(hash(&rejected), before);
        assert_eq!(hash(&imps[..2]), before);
        // The order the registry lists them in is no input.
        let reversed: Vec<Implementation> = imps.iter().rev().cloned().collect();
        assert_eq!(hash(&reversed), before);
    }

    /// A fresh record of `imp` for `w` on class `c-2c`.
    fn record(imp: &Implementation, w: &Workload, median: u64, p90: u64, ok: bool) -> rankings::Record {
        rankings::Record {
            element: None,
            implementation: imp.name.clone(),
            version: imp.version.clone(),
            source_sha256: rankings::measured_source_sha256(imp, &Registry::default()),
            shapes: rankings::shapes_signature(w),
            cpu: "cpu".into(),
            cores: 2,
            cpu_features: vec!["avx2".into()],
            rustc: "rustc 1.95.0".into(),
            build_flags: rankings::BUILD_FLAGS.into(),
            measured_at: "2026-11-29T21:00:00Z".into(),
            status: if ok { rankings::Status::Ok } else { rankings::Status::Failed },
            failure: (!ok).then(|| "down_proj at 1 rows: at index 160 got NaN".to_string()),
            median_ns: median,
            p90_ns: p90,
            samples: 21,
            prefill_median_ns: median / 2,
            decode_median_ns: median / 200,
            load_ns: None,
            load_max_ns: None,
            rounds_ns: vec![],
            load_counted_ns: 0,
            load_counted_max_ns: 0,
            harness_sha256: None,
            dependencies: None,
        }
    }

    fn measured_workload() -> Workload {
        let mut w = workload();
        w.target.hardware = Some("c-2c".into());
        w
    }

    fn selection(records: Vec<rankings::Record>, incumbent: Option<&str>) -> Selection {
        let mut r = Rankings::default();
        let shapes = records.first().map(|r| r.shapes.clone()).unwrap_or_default();
        r.replace("c-2c", "matmul", &shapes, records, |_| true);
        Selection {
            rankings: r,
            incumbents: incumbent.map(|i| ("matmul".to_string(), i.to_string())).into_iter().collect(),
            forced: BTreeMap::new(),
            forced_because: None,
        }
    }

    fn three() -> Vec<Implementation> {
        vec![
            imp("avx2", 20, needs(&["avx2", "fma"]), &[]),
            imp("blocked", 10, Constraints::default(), &[]),
            imp("scalar", 0, Constraints::default(), &[]),
        ]
    }

    #[test]
    fn the_fastest_measurement_beats_declared_priority() {
        let w = measured_workload();
        let imps = three();
        let sel = selection(
            vec![
                record(&imps[0], &w, 300, 310, true),
                record(&imps[1], &w, 100, 104, true),
                record(&imps[2], &w, 900, 950, true),
            ],
            None,
        );
        let (chosen, candidates, unmeasured) =
            choose("matmul", &imps, &w, &Registry::default(), &sel).unwrap();
        assert_eq!(chosen.name, "blocked");
        assert!(chosen.reason.contains("fastest measured on c-2c"), "{}", chosen.reason);
        assert!(chosen.reason.contains("3.00x faster than avx2"), "{}", chosen.reason);
        assert!(unmeasured.is_empty());
        assert!(
            matches!(&candidates[0].verdict, Verdict::Outranked { basis, .. } if basis == "slower when measured on c-2c")
        );
    }

    #[test]
    fn a_candidate_that_failed_against_the_reference_is_never_chosen() {
        let w = measured_workload();
        let imps = three();
        // The fastest and highest-priority candidate, wrong in a tail case.
        let sel = selection(
            vec![
                record(&imps[0], &w, 10, 11, false),
                record(&imps[1], &w, 100, 104, true),
                record(&imps[2], &w, 900, 950, true),
            ],
            Some("avx2"),
        );
        let (chosen, candidates, _) = choose("matmul", &imps, &w, &Registry::default(), &sel).unwrap();
        assert_eq!(chosen.name, "blocked");
        assert!(
            matches!(&candidates[0].verdict, Verdict::Failed { failure } if failure.contains("down_proj"))
        );
        // Even without any other measurement, declared priority skips it.
        let sel = selection(vec![record(&imps[0], &w, 10, 11, false)], None);
        let (chosen, _, unmeasured) = choose("matmul", &imps, &w, &Registry::default(), &sel).unwrap();
        assert_eq!(chosen.name, "blocked");
        assert_eq!(unmeasured.len(), 2, "{unmeasured:?}");
    }

    #[test]
    fn an_incumbent_within_the_noise_keeps_its_place_and_a_2x_challenger_replaces_it() {
        let w = measured_workload();
        let imps = three();
        let near = vec![
            record(&imps[0], &w, 102, 106, true),
            record(&imps[1], &w, 100, 104, true),
            record(&imps[2], &w, 900, 950, true),
        ];
        let (chosen, ..) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(near.clone(), Some("avx2")))
                .unwrap();
        assert_eq!(chosen.name, "avx2", "2% inside the noise: the incumbent stays");
        assert!(chosen.reason.contains("the previous choice stays"), "{}", chosen.reason);
        // Measured again the other way round: still no flip.
        let swapped = vec![
            record(&imps[0], &w, 100, 104, true),
            record(&imps[1], &w, 102, 106, true),
            record(&imps[2], &w, 900, 950, true),
        ];
        let (chosen, ..) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(swapped, Some("avx2"))).unwrap();
        assert_eq!(chosen.name, "avx2");
        let (chosen, ..) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(near, Some("blocked"))).unwrap();
        assert_eq!(chosen.name, "blocked");
        // Twice as fast flips.
        let far = vec![
            record(&imps[0], &w, 200, 206, true),
            record(&imps[1], &w, 100, 104, true),
            record(&imps[2], &w, 900, 950, true),
        ];
        let (chosen, ..) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(far, Some("avx2"))).unwrap();
        assert_eq!(chosen.name, "blocked");
        assert!(
            chosen.reason.contains("it replaces avx2 (0.500x its median), beyond the noise margin"),
            "{}",
            chosen.reason
        );
    }

    #[test]
    fn an_incumbent_is_judged_round_by_round_within_one_run() {
        let w = measured_workload();
        let imps = three();
        // The machine's pace moves a third from round to round; blocked is 8% faster than avx2
        // in every round, which the medians' spreads hide.
        let machine: [u64; 10] = [100, 130, 100, 120, 100, 125, 100, 130, 110, 100];
        let timed = |imp: &Implementation, percent: u64| {
            let rounds: Vec<u64> = machine.iter().map(|t| t * percent).collect();
            let mut sorted = rounds.clone();
            sorted.sort();
            rankings::Record { rounds_ns: rounds, ..record(imp, &w, sorted[5], sorted[8], true) }
        };
        let paired = vec![timed(&imps[0], 100), timed(&imps[1], 92), timed(&imps[2], 900)];
        let (chosen, ..) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(paired.clone(), Some("avx2")))
                .unwrap();
        assert_eq!(chosen.name, "blocked");
        assert!(
            chosen.reason.contains("it replaces avx2 (0.920x its time round by round over 10 rounds)"),
            "{}",
            chosen.reason
        );
        // The same records without their rounds: the medians, inside the noise, keep avx2.
        let unpaired: Vec<_> =
            paired.into_iter().map(|r| rankings::Record { rounds_ns: vec![], ..r }).collect();
        let (chosen, ..) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(unpaired, Some("avx2"))).unwrap();
        assert_eq!(chosen.name, "avx2");
        assert!(
            chosen.reason.contains("(0.920x its median), a difference inside the noise"),
            "{}",
            chosen.reason
        );
    }

    #[test]
    fn stale_and_missing_records_are_named_and_never_used() {
        let w = measured_workload();
        let mut imps = three();
        let records = vec![record(&imps[0], &w, 300, 310, true), record(&imps[1], &w, 100, 104, true)];
        // blocked's kernel changes after it was measured.
        imps[1].source_sha256 = "edited".into();
        let (chosen, candidates, unmeasured) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(records, None)).unwrap();
        assert_eq!(chosen.name, "avx2", "the only fresh measurement");
        assert_eq!(
            unmeasured,
            [
                "matmul/blocked's measurements on c-2c are stale: its source (kernel.rs or a shared module it uses) changed since it was measured",
                "matmul/scalar has not been measured on c-2c at this workload's shapes",
            ]
        );
        assert!(matches!(&candidates[1].evidence, Some(Evidence::Stale { .. })));
    }

    #[test]
    fn records_of_an_older_harness_count_until_one_is_measured_again() {
        let w = measured_workload();
        let imps = three();
        let older = |r: rankings::Record| rankings::Record {
            build_flags: rankings::BUILD_FLAGS.replacen("harness=", "harness=0", 1),
            measured_at: "2026-11-28T21:00:00Z".into(),
            ..r
        };
        // Every candidate measured by an older harness: still compared with each other.
        let all_older = vec![
            older(record(&imps[0], &w, 300, 310, true)),
            older(record(&imps[1], &w, 100, 104, true)),
            older(record(&imps[2], &w, 200, 204, true)),
        ];
        let (chosen, _, unmeasured) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(all_older.clone(), None)).unwrap();
        assert_eq!(chosen.name, "blocked");
        assert!(unmeasured.is_empty(), "{unmeasured:?}");
        // One measured again by this harness: the others are stale beside it.
        let mut mixed = all_older;
        mixed[2] = record(&imps[2], &w, 200, 204, true);
        let (chosen, _, unmeasured) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(mixed, None)).unwrap();
        assert_eq!(chosen.name, imps[2].name, "the only record of the newest harness");
        assert_eq!(unmeasured.len(), 2, "{unmeasured:?}");
        assert!(unmeasured[0].contains("measured by harness=0"), "{unmeasured:?}");
        assert!(unmeasured[0].contains("the newest records of this interface by harness="), "{unmeasured:?}");
        // Other compiler flags are stale whatever the harness.
        let flags = rankings::Record {
            build_flags: rankings::BUILD_FLAGS.replace("opt-level=3", "opt-level=2"),
            ..record(&imps[1], &w, 100, 104, true)
        };
        let (_, _, unmeasured) =
            choose("matmul", &imps, &w, &Registry::default(), &selection(vec![flags], None)).unwrap();
        assert!(unmeasured.iter().any(|u| u.contains("other build flags")), "{unmeasured:?}");
    }

    /// Every input of a record's key, changed alone, makes it stale and is named; with none
    /// changed, it is fresh.
    #[test]
    fn every_input_of_the_key_stales_a_record_and_says_which() {
        let w = measured_workload();
        let mut gemm = imp("gemm-crate", 10, Constraints::default(), &[]);
        gemm.dependencies = vec!["gemm".into()];
        let lock = |gemm: &str| {
            rankings::CargoLock::parse(&format!(
                "[[package]]\nname = \"gemm\"\nversion = \"{gemm}\"\ndependencies = [\"pulp\"]\n\n\
                 [[package]]\nname = \"pulp\"\nversion = \"0.21.5\"\n\n\
                 [[package]]\nname = \"unrelated\"\nversion = \"1.0.0\"\n"
            ))
            .unwrap()
        };
        let base = rankings::Record {
            harness_sha256: Some("h1".into()),
            dependencies: Some(vec!["gemm 0.19.0".into(), "pulp 0.21.5".into()]),
            ..record(&gemm, &w, 300, 310, true)
        };
        assert_eq!(lock("0.19.0").closure(&gemm.dependencies), base.dependencies.clone().unwrap());
        let current = rankings::Current {
            harness_sha256: [("llama".to_string(), "h1".to_string())].into(),
            lock: Some(lock("0.19.0")),
            rustc_pin: None,
        };
        let why = |records: Vec<rankings::Record>, current: &rankings::Current, imp: &Implementation| {
            let mut sel = selection(records, None);
            sel.rankings.current = current.clone();
            match &rankings::evidence(&sel.rankings, &Registry::default(), "matmul", &[imp], &w)[0] {
                Evidence::Stale { why, .. } => why.join("; "),
                Evidence::Measured(_) => String::new(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(why(vec![base.clone()], &current, &gemm), "", "nothing changed: fresh");
        // What the repository says now.
        let harness = rankings::Current {
            harness_sha256: [("llama".to_string(), "h2".to_string())].into(),
            ..current.clone()
        };
        assert_eq!(
            why(vec![base.clone()], &harness, &gemm),
            "the benchmark harness (templates/bench/) changed since it was measured: re-measure"
        );
        let bumped = rankings::Current { lock: Some(lock("0.19.1")), ..current.clone() };
        assert_eq!(why(vec![base.clone()], &bumped, &gemm), "gemm 0.19.0 → 0.19.1 (Cargo.lock): re-measure");
        let pinned = rankings::Current {
            rustc_pin: Some(("1.96.0".into(), "rust-toolchain.toml".into())),
            ..current.clone()
        };
        assert_eq!(
            why(vec![base.clone()], &pinned, &gemm),
            "rustc 1.95.0 → 1.96.0 (rust-toolchain.toml): re-measure"
        );
        let pinned_same = rankings::Current {
            rustc_pin: Some(("1.95.0".into(), "rust-toolchain.toml".into())),
            ..current.clone()
        };
        assert_eq!(why(vec![base.clone()], &pinned_same, &gemm), "");
        // The implementation: its version, its source (a shared module it uses is covered by
        // measured_source_sha256, tested with the registry).
        let newer = Implementation { version: "1.0.1".into(), ..gemm.clone() };
        assert!(
            why(vec![base.clone()], &current, &newer)
                .contains("measured at version 1.0.0, the registry has 1.0.1")
        );
        let edited = Implementation { source_sha256: "edited".into(), ..gemm.clone() };
        assert!(
            why(vec![base.clone()], &current, &edited).contains("its source (kernel.rs or a shared module")
        );
        // The build flags.
        let flags = rankings::Record {
            build_flags: rankings::BUILD_FLAGS.replace("lto=thin", "lto=fat"),
            ..base.clone()
        };
        assert!(why(vec![flags], &current, &gemm).contains("other build flags"));
        // The machine and the toolchain, against the newest record of the interface.
        let other = imp("other", 5, Constraints::default(), &[]);
        let newest = |change: fn(&mut rankings::Record)| {
            let mut r = record(&other, &w, 400, 410, true);
            r.measured_at = "2026-12-01T00:00:00Z".into();
            change(&mut r);
            why(vec![base.clone(), r], &current, &gemm)
        };
        assert_eq!(newest(|_| {}), "", "the same machine and toolchain");
        assert_eq!(
            newest(|r| r.rustc = "rustc 1.96.0".into()),
            "rustc 1.95.0 → rustc 1.96.0 (the newest records of this interface): re-measure"
        );
        assert_eq!(
            newest(|r| r.cpu = "other cpu".into()),
            "CPU cpu → other cpu (the newest records of this interface): re-measure"
        );
        assert_eq!(newest(|r| r.cores = 4), "cores 2 → 4 (the newest records of this interface): re-measure");
        assert_eq!(
            newest(|r| r.cpu_features = vec!["avx2".into(), "avx512f".into()]),
            "CPU features +avx512f (the newest records of this interface): re-measure"
        );
    }

    #[test]
    fn a_toolchain_file_pins_a_release_or_nothing() {
        assert_eq!(
            rankings::pinned_rust_version("[toolchain]\nchannel = \"1.95.0\"\n").as_deref(),
            Some("1.95.0")
        );
        assert_eq!(rankings::pinned_rust_version("1.96\n").as_deref(), Some("1.96"));
        assert_eq!(rankings::pinned_rust_version("[toolchain]\nchannel = \"stable\"\n"), None);
        assert_eq!(rankings::pinned_rust_version("nightly-2026-01-01\n"), None);
        assert_eq!(rankings::rustc_release("rustc 1.95.0 (59807616e 2026-04-14)"), "1.95.0");
    }

    #[test]
    fn packing_at_load_counts_only_where_the_workload_says_how_many_requests_a_load_serves() {
        let mut imps = vec![
            imp("packed", 20, Constraints::default(), &[]),
            imp("plain", 10, Constraints::default(), &[]),
        ];
        imps[0].packs_weights = true;
        let serving = |n: Option<u64>| {
            let mut w = measured_workload();
            let crate::workload::Request::Decoder(r) = &mut w.request else { unreachable!() };
            r.requests_per_load = n;
            w
        };
        let w = serving(None);
        // The packed kernel: 100 a request, 150 of packing at load; the plain one 130. Paired
        // rounds, the machine's pace moving.
        let machine = [100u64, 120, 100, 110, 100];
        let timed = |imp: &Implementation, per: u64, load: Option<u64>| rankings::Record {
            rounds_ns: machine.iter().map(|t| t * per / 100).collect(),
            load_ns: load,
            ..record(imp, &w, per, per + 5, true)
        };
        let records = vec![timed(&imps[0], 100, Some(150)), timed(&imps[1], 130, None)];
        let choice = |n: Option<u64>, records: &[rankings::Record]| {
            choose("matmul", &imps, &serving(n), &Registry::default(), &selection(records.to_vec(), None))
                .unwrap()
        };
        // A server that loads once: the packing is not counted.
        let (chosen, candidates, _) = choice(None, &records);
        assert_eq!(chosen.name, "packed");
        let Some(Evidence::Measured(r)) = &candidates[0].evidence else { panic!("{candidates:?}") };
        assert_eq!((r.median_ns, r.load_counted_ns), (100, 0));
        // 10 requests a load: 15 each, still faster.
        let (chosen, candidates, _) = choice(Some(10), &records);
        assert_eq!(chosen.name, "packed");
        assert!(chosen.reason.contains("packing at load counted over 10 requests"), "{}", chosen.reason);
        let Some(Evidence::Measured(r)) = &candidates[0].evidence else { panic!("{candidates:?}") };
        assert_eq!((r.median_ns, r.p90_ns, r.load_counted_ns), (115, 120, 15));
        assert_eq!(r.rounds_ns, [115, 135, 115, 125, 115], "every round charged alike");
        // A process per request: 250 against 130.
        let (chosen, candidates, _) = choice(Some(1), &records);
        assert_eq!(chosen.name, "plain");
        assert!(chosen.reason.contains("packing at load counted in full"), "{}", chosen.reason);
        assert!(chosen.reason.contains("1.92x faster than packed"), "{}", chosen.reason);
        let Some(Evidence::Measured(r)) = &candidates[1].evidence else { panic!("{candidates:?}") };
        assert_eq!((r.median_ns, r.load_counted_ns), (130, 0), "nothing to add where nothing is packed");
        assert!(
            matches!(&candidates[0].verdict, Verdict::Outranked { reason, .. }
                if reason == "measured 250 ns per request, 1.92x plain's 130 ns (packing at load counted in full)"),
            "{:?}",
            candidates[0].verdict
        );
        // A load time in the record of a kernel that does not pack (its manifest changed) is
        // never charged.
        let mut unpacking = imps.clone();
        unpacking[0].packs_weights = false;
        let (chosen, candidates, _) = choose(
            "matmul",
            &unpacking,
            &serving(Some(1)),
            &Registry::default(),
            &selection(records.clone(), None),
        )
        .unwrap();
        assert_eq!(chosen.name, "packed");
        let Some(Evidence::Measured(r)) = &candidates[0].evidence else { panic!("{candidates:?}") };
        assert_eq!((r.median_ns, r.load_counted_ns), (100, 0));
        // A record from before the harness timed the packing: stale where the load counts.
        let old = vec![timed(&imps[0], 100, None), timed(&imps[1], 130, None)];
        let (chosen, _, unmeasured) = choice(Some(1), &old);
        assert_eq!(chosen.name, "plain");
        assert_eq!(
            unmeasured,
            [
                "matmul/packed's measurements on c-2c are stale: it packs its weights at load, which this workload counts (request.requests_per_load), and the record has no time of its packing"
            ]
        );
        let (chosen, _, unmeasured) = choice(None, &old);
        assert_eq!(chosen.name, "packed");
        assert!(unmeasured.is_empty(), "{unmeasured:?}");
        // A packing kernel that failed against the reference is out, with or without a load time.
        let failed = vec![
            rankings::Record { load_ns: None, ..record(&imps[0], &w, 100, 105, false) },
            records[1].clone(),
        ];
        let (chosen, candidates, unmeasured) = choice(Some(1), &failed);
        assert_eq!(chosen.name, "plain");
        assert!(unmeasured.is_empty(), "{unmeasured:?}");
        assert!(matches!(&candidates[0].verdict, Verdict::Failed { .. }), "{:?}", candidates[0].verdict);
    }

    #[test]
    fn without_a_hardware_class_priority_decides_and_nothing_is_missing() {
        let w = workload();
        let imps = three();
        let sel = selection(vec![record(&imps[1], &measured_workload(), 1, 1, true)], None);
        let (chosen, _, unmeasured) = choose("matmul", &imps, &w, &Registry::default(), &sel).unwrap();
        assert_eq!(chosen.name, "avx2");
        assert!(chosen.reason.contains("names no hardware class"), "{}", chosen.reason);
        assert!(unmeasured.is_empty());
    }

    #[test]
    fn footprint_counts_stories260k_parameters() {
        let w = workload();
        let consts = consts(&w);
        let f = footprint(&w, &consts);
        // 512·64 embedding + 5 layers · (2·64 + 64·64 + 2·64·32 + 64·64 + 3·64·172) + 64
        assert_eq!(f.parameters, 32768 + 5 * (128 + 4096 + 4096 + 4096 + 33024) + 64);
        assert_eq!(f.kv_cache_bytes, 2 * 5 * 512 * 32 * 4);
        assert_eq!(f.kv_caches, 1);
    }

    #[test]
    fn a_server_holds_its_kv_slots_and_steps_a_chunk_beside_a_batch() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = root.join("workloads/stories260k-serve-cpu-f32.toml");
        let w = WorkloadSource::read(&path).unwrap().parse().unwrap();
        let consts = consts(&w);
        let Consts::Llama(c) = &consts else { panic!("a llama workload") };
        assert_eq!((c.request.max_batch, c.step_rows), (4, 128 + 4));
        assert_eq!(c.serving.as_ref().map(|s| (s.kv_slots, s.max_queue)), Some((8, 16)));
        let f = footprint(&w, &consts);
        assert_eq!((f.kv_cache_bytes, f.kv_caches), (2 * 5 * 512 * 32 * 4, 8));
        // x, xb: [rows, 64]; q, att: [rows, 64]; k, v: [rows, 32]; gate, up: [rows, 172];
        // scores: [512]; logits: [4, 512]
        assert_eq!(f.scratch_bytes, (132 * (2 * 64 + 2 * 64 + 2 * 32 + 2 * 172) + 512 + 4 * 512) * 4);
    }

    #[test]
    fn an_encoder_that_serves_waits_its_batch_wait_and_bounds_its_queue() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = root.join("workloads/all-minilm-l6-v2-serve-cpu-f32.toml");
        let w = WorkloadSource::read(&path).unwrap().parse().unwrap();
        let Consts::Bert(c) = consts(&w) else { panic!("a bert workload") };
        let s = c.serving.expect("a [serving] table");
        assert_eq!((s.batch_wait_ms, s.max_queue, s.max_body_bytes, c.max_batch), (2, 64, 1 << 20, 32));
        let text = std::fs::read_to_string(&path).unwrap().replace("batch_wait_ms = 2\n", "");
        let w = WorkloadSource::from_text("w.toml", &text).parse().unwrap();
        let Consts::Bert(c) = consts(&w) else { panic!("a bert workload") };
        assert_eq!(c.serving.map(|s| s.batch_wait_ms), Some(2), "2 ms unless set");
    }

    #[test]
    fn a_llama_footprint_counts_its_norms_in_f32_whatever_the_dtype() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = root.join("workloads/stories260k-cpu-int8.toml");
        let w = WorkloadSource::read(&path).unwrap().parse().unwrap();
        let f = footprint(&w, &consts(&w));
        // 2 norms of 64 per layer and the final one stay f32; every matrix is int8.
        let norms = 5 * 128 + 64;
        let matrices = f.parameters - norms;
        assert_eq!(f.weight_bytes, matrices + matrices.div_ceil(32) * 4 + norms * 4);
    }

    #[test]
    fn a_bert_footprint_counts_only_its_linear_layers_in_a_reduced_dtype() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let bytes = |dtype: &str| {
            let path = root.join(format!("workloads/all-minilm-l6-v2-cpu-{dtype}.toml"));
            let w = WorkloadSource::read(&path).unwrap().parse().unwrap();
            let f = footprint(&w, &consts(&w));
            (f.parameters, f.weight_bytes)
        };
        let (parameters, f32_bytes) = bytes("f32");
        assert_eq!(f32_bytes, parameters * 4);
        // 6 layers of four 384 × 384 and two 384 × 1536 matrices; the rest stays f32.
        let matrices = 6 * (4 * 384 * 384 + 2 * 384 * 1536);
        let rest = (parameters - matrices) * 4;
        assert_eq!(bytes("bf16").1, matrices * 2 + rest);
        assert_eq!(bytes("int8").1, matrices + matrices / 32 * 4 + rest);
    }
}
