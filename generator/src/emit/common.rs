//! What the emitters of every architecture share: the kernel files, the start-up CPU check,
//! the kernels module, and literal helpers.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, format_ident, quote};

use super::Templates;
use crate::Error;
use crate::plan::Plan;
use crate::registry::Registry;
use crate::rust_source;
use crate::workload::Dtype;

/// How a crate holds its matrices (the weights of its linear layers), which decides the
/// interface those layers run through. Everything else stays f32.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Matrices {
    /// f32 slices; `matmul`.
    F32,
    /// f32 copies rewritten at load by the chosen `matmul`'s `pack` (packed.rs), for a kernel
    /// that reads its weights in a layout of its own; `matmul`.
    Packed,
    /// bfloat16 slices (bf16_tensor.rs); `matmul<bf16>`.
    Bf16,
    /// bfloat16 copies rewritten at load by the chosen `matmul<bf16>`'s `pack`
    /// (bf16_tensor.rs's `bf16_packed`); `matmul<bf16>`.
    Bf16Packed,
    /// Blockwise int8 values and scales (q8_tensor.rs); `matmul<q8>`.
    Q8,
    /// Blockwise int8 values and scales rewritten at load by the chosen `matmul<q8>`'s `pack`
    /// (q8_tensor.rs's `q8_packed_many`); `matmul<q8>`.
    Q8Packed,
    /// Blockwise int4 values, two to a byte, and binary16 scales (q4_tensor.rs); `matmul<q4>`.
    Q4,
}

impl Matrices {
    pub fn of(plan: &Plan) -> Matrices {
        match plan.weights.dtype {
            Dtype::Bf16 if crate::plan::matmul_packs_weights(&plan.interfaces) => Matrices::Bf16Packed,
            Dtype::Bf16 => Matrices::Bf16,
            Dtype::Int8 if crate::plan::matmul_packs_weights(&plan.interfaces) => Matrices::Q8Packed,
            Dtype::Int8 => Matrices::Q8,
            Dtype::Int4 => Matrices::Q4,
            Dtype::F32 | Dtype::F16 if crate::plan::matmul_packs_weights(&plan.interfaces) => {
                Matrices::Packed
            }
            Dtype::F32 | Dtype::F16 => Matrices::F32,
        }
    }

    /// How a decoder holds its classifier where `weights.classifier_dtype` gives it an element
    /// type of its own (its kernel never packs: `resolve::classifier_matmul`); `None` where the
    /// classifier is held as the other matrices are.
    pub fn classifier(plan: &Plan) -> Option<Matrices> {
        Some(match plan.weights.classifier()? {
            Dtype::Bf16 => Matrices::Bf16,
            Dtype::Int8 => Matrices::Q8,
            Dtype::Int4 => Matrices::Q4,
            Dtype::F32 | Dtype::F16 => Matrices::F32,
        })
    }

    /// The runtime file (templates/runtime/) that defines the matrix type, if it is not the
    /// f32 `Tensor` of tensor_file.rs.
    pub fn runtime_file(self) -> Option<&'static str> {
        match self {
            Matrices::F32 => None,
            Matrices::Packed => Some("packed.rs"),
            Matrices::Bf16 | Matrices::Bf16Packed => Some("bf16_tensor.rs"),
            Matrices::Q8 | Matrices::Q8Packed => Some("q8_tensor.rs"),
            Matrices::Q4 => Some("q4_tensor.rs"),
        }
    }

    /// Whether the matrices are copies in the layout of the matmul kernel, rewritten at load by
    /// its `pack`.
    pub fn packed(self) -> bool {
        matches!(self, Matrices::Packed | Matrices::Bf16Packed | Matrices::Q8Packed)
    }

    /// That runtime file's methods that this crate never calls, which the emitter leaves out.
    pub fn unused_methods(self) -> &'static [&'static str] {
        match self {
            Matrices::Bf16 => &["bf16_packed"],
            Matrices::Q8 => &["q8_packed_many", "q8_packed", "mapped_packed_q8"],
            _ => &[],
        }
    }

    /// The methods of tensor_file.rs that this crate never calls: `packed_entry` and
    /// `save_packed` (a saved model's packed matrices) serve only packed matrices,
    /// `on_cache_line` only packed bf16 and int8 ones, `slice_f32` and `in_pages` only packed f32 ones.
    pub fn unused_tensor_file_methods(self) -> &'static [&'static str] {
        match self {
            Matrices::Bf16Packed | Matrices::Q8Packed => &["slice_f32", "in_pages"],
            Matrices::Packed => &["on_cache_line"],
            Matrices::F32 | Matrices::Bf16 | Matrices::Q8 | Matrices::Q4 => {
                &["packed_entry", "save_packed", "slice_f32", "in_pages", "on_cache_line"]
            }
        }
    }

    /// The `mod` item of that runtime file for lib.rs, as (`bf16_tensor`, `packed`, `q4_tensor`
    /// or `q8_tensor`): lib.rs lists its modules in alphabetical order, the first before `cpu`,
    /// the second after `model`.
    pub fn modules(self) -> (Option<TokenStream>, Option<TokenStream>) {
        let module = self.runtime_file().map(|file| {
            let module = format_ident!("{}", file.trim_end_matches(".rs"));
            quote!(
                mod #module;
            )
        });
        match self {
            Matrices::Bf16 | Matrices::Bf16Packed => (module, None),
            Matrices::Q8 | Matrices::Q8Packed | Matrices::Packed | Matrices::Q4 => (None, module),
            Matrices::F32 => (None, None),
        }
    }

    /// The matrix type, the `TensorFile` method that loads one, and the `use` item of the
    /// type (none for `Tensor`, which weights.rs imports anyway).
    pub fn tensor(self) -> (TokenStream, proc_macro2::Ident, TokenStream) {
        match self {
            Matrices::Bf16 => (
                quote!(Bf16Tensor),
                format_ident!("bf16"),
                quote!(
                    use crate::bf16_tensor::Bf16Tensor;
                ),
            ),
            Matrices::Bf16Packed => (
                quote!(Bf16Tensor),
                format_ident!("bf16_packed"),
                quote!(
                    use crate::bf16_tensor::Bf16Tensor;
                ),
            ),
            Matrices::Q8 => (
                quote!(Q8Tensor),
                format_ident!("q8"),
                quote!(
                    use crate::q8_tensor::Q8Tensor;
                ),
            ),
            Matrices::Q8Packed => (
                quote!(Q8Tensor),
                format_ident!("q8_packed"),
                quote!(
                    use crate::q8_tensor::Q8Tensor;
                ),
            ),
            Matrices::Q4 => (
                quote!(Q4Tensor),
                format_ident!("q4"),
                quote!(
                    use crate::q4_tensor::Q4Tensor;
                ),
            ),
            Matrices::F32 => (quote!(Tensor), format_ident!("f32"), quote!()),
            Matrices::Packed => (quote!(Tensor), format_ident!("packed"), quote!()),
        }
    }

    /// The statement `out = x · wᵀ` over `rows` rows, for `[n, k]` weights `w`, with the
    /// crate's matmul (`kernels::matmul::matmul`, whose weights are one slice at every element
    /// type but int8 and int4, whose are a pair of the values and their scales).
    pub fn matmul_call(
        self,
        shape: [&str; 2],
        out: TokenStream,
        x: TokenStream,
        w: TokenStream,
        rows: TokenStream,
    ) -> TokenStream {
        self.matmul_call_with(quote!(matmul), shape, out, x, w, rows)
    }

    /// [`Matrices::matmul_call`] through the matmul function at `function` (the classifier's
    /// own: `crate::kernels::matmul_classifier::matmul`).
    pub fn matmul_call_with(
        self,
        function: TokenStream,
        [n, k]: [&str; 2],
        out: TokenStream,
        x: TokenStream,
        w: TokenStream,
        rows: TokenStream,
    ) -> TokenStream {
        let (n, k) = (format_ident!("{n}"), format_ident!("{k}"));
        match self {
            Matrices::F32 | Matrices::Packed | Matrices::Bf16 | Matrices::Bf16Packed => {
                quote!(#function::<#n, #k>(#out, #x, &#w, #rows);)
            }
            Matrices::Q8 | Matrices::Q8Packed | Matrices::Q4 => {
                quote!(#function::<#n, #k>(#out, #x, (#w.values(), #w.scales()), #rows);)
            }
        }
    }
}

/// The compile-time guards of a crate's lib.rs: the target arch its kernels were compiled for
/// (when they use CPU features) and a little-endian target (the weights are read in place).
pub fn target_guards(plan: &Plan) -> TokenStream {
    let name = &plan.name;
    let arch_guard = (!plan.cpu_features.is_empty()).then(|| {
        let arch = &plan.target.arch;
        let message = format!("{name} was generated for {arch} CPUs (target.arch of its workload)");
        quote! {
            #[cfg(not(target_arch = #arch))]
            compile_error!(#message);
        }
    });
    let endian_message =
        format!("{name} reads little-endian safetensors data in place and needs a little-endian target");
    quote! {
        #arch_guard
        #[cfg(not(target_endian = "little"))]
        compile_error!(#endian_message);
    }
}

/// `src/kernels/<interface>.rs` for every chosen implementation (`<interface>_<role>.rs` for a
/// role's own, such as the classifier's `matmul`) and
/// `src/kernels/shared/<module>.rs` for the helpers they use, each with a provenance line.
pub fn kernel_files(plan: &Plan, registry: &Registry) -> Result<Vec<(String, String)>, Error> {
    let mut files = Vec::new();
    for i in &plan.interfaces {
        let imp = registry
            .implementation(&i.interface, &i.chosen.name, i.element.as_deref())
            .expect("the plan only names implementations of the registry it was resolved against");
        let file = rust_source::parse_with_comments(&imp.source).map_err(|e| Error::Template {
            name: imp.dir.join("kernel.rs").display().to_string(),
            message: e.message,
        })?;
        let provenance = format!(
            "// {}: `{}` {}, from {}/kernel.rs\n",
            i.title(),
            imp.name,
            imp.version,
            imp.dir.display().to_string().replace('\\', "/")
        );
        files.push((format!("src/kernels/{}.rs", i.module()), provenance + &rust_source::print(&file)));
    }
    for name in &plan.shared_modules {
        let module = &registry.shared[name];
        let file = rust_source::parse_with_comments(&module.source)
            .map_err(|e| Error::Template { name: module.path.display().to_string(), message: e.message })?;
        let provenance =
            format!("// shared helpers, from {}\n", module.path.display().to_string().replace('\\', "/"));
        files.push((format!("src/kernels/shared/{name}.rs"), provenance + &rust_source::print(&file)));
    }
    Ok(files)
}

pub fn usize_lit(v: usize) -> Literal {
    Literal::usize_unsuffixed(v)
}

/// A float literal that reads like the workload file (`1e-5`, `10000.0`).
pub fn f32_lit(v: f32) -> syn::LitFloat {
    let text = format!("{v:?}");
    let text = if text.contains(['.', 'e']) { text } else { format!("{text}.0") };
    syn::LitFloat::new(&text, Span::call_site())
}

pub fn doc(text: &str) -> TokenStream {
    let lines: Vec<String> = text.lines().map(|l| format!(" {l}")).collect();
    quote! { #(#[doc = #lines])* }
}

pub fn cpu_rs(plan: &Plan) -> TokenStream {
    let features = &plan.cpu_features;
    if features.is_empty() {
        return quote! {
            //! The start-up check. No kernel of this crate enables a CPU feature beyond the
            //! target's baseline, so there is nothing to check.

            use crate::Error;

            /// Always succeeds: this crate runs on any CPU of its target.
            pub fn check() -> Result<(), Error> {
                Ok(())
            }
        };
    }
    let list = features.join(", ");
    let module_doc = format!(" The start-up check: the kernels of this crate were compiled for {list}.");
    let detected = features.iter().map(|f| feature_detected(f));
    let amx = needs_amx_fn(features).then(amx_fn);
    quote! {
        #![doc = #module_doc]

        use crate::{Error, WORKLOAD};

        /// Returns an error naming every CPU feature the chosen kernels need that this CPU
        /// lacks. [`crate::Model::load`] calls it before anything runs a kernel.
        pub fn check() -> Result<(), Error> {
            let mut missing = Vec::new();
            #(
                if !#detected {
                    missing.push(#features);
                }
            )*
            if missing.is_empty() {
                return Ok(());
            }
            Err(Error::UnsupportedCpu { missing: missing.join(", "), workload: WORKLOAD })
        }

        #amx
    }
}

/// The test of one CPU feature at start-up: `is_x86_feature_detected!`, except for the AMX
/// features, whose detection macro is unstable: a call of the `amx` function of [`amx_fn`].
pub fn feature_detected(feature: &str) -> TokenStream {
    match crate::cpu::amx_bit(feature) {
        Some(bit) => {
            let bit = Literal::u32_unsuffixed(bit);
            quote!(amx(#bit))
        }
        None => quote!(std::arch::is_x86_feature_detected!(#feature)),
    }
}

/// Whether any of `features` is an AMX feature, which [`feature_detected`] tests with [`amx_fn`].
pub fn needs_amx_fn(features: &[String]) -> bool {
    features.iter().any(|f| crate::cpu::amx_bit(f).is_some())
}

/// `fn amx(bit)`: whether the CPU has the AMX feature of CPUID leaf 7's EDX bit `bit` and the
/// kernel lets the process use the tiles (on Linux, the 8 KiB of tile state go only to a
/// process that asks for them before its first tile instruction).
pub fn amx_fn() -> TokenStream {
    let safety = [
        "SAFETY: this Linux system call only changes which register state the kernel lets",
        "the process use; it reads and writes none of the process's memory.",
    ]
    .map(crate::rust_source::comment);
    quote! {
        /// Whether the CPU has the AMX feature of CPUID leaf 7's EDX bit `bit`, and the kernel
        /// lets this process use the tiles: Linux hands their 8 KiB of register state only to a
        /// process that asks, `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, before its
        /// first tile instruction. Asking again is harmless. Elsewhere the tiles are not used.
        fn amx(bit: u32) -> bool {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            if __cpuid(0).eax < 7 || __cpuid_count(7, 0).edx & (1 << bit) == 0 {
                return false;
            }
            #[cfg(target_os = "linux")]
            {
                const SYS_ARCH_PRCTL: isize = 158;
                const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
                const XFEATURE_XTILEDATA: usize = 18;
                let result: isize;
                #(#safety)*
                unsafe {
                    std::arch::asm!(
                        "syscall",
                        inlateout("rax") SYS_ARCH_PRCTL => result,
                        in("rdi") ARCH_REQ_XCOMP_PERM,
                        in("rsi") XFEATURE_XTILEDATA,
                        lateout("rcx") _,
                        lateout("r11") _,
                        options(nostack),
                    )
                };
                result == 0
            }
            #[cfg(not(target_os = "linux"))]
            {
                false
            }
        }
    }
}

/// `pub mod <module>;` for a chosen kernel's module in src/kernels/mod.rs (CPU or CUDA crate).
pub fn kernel_module(plan: &Plan, module: &str) -> TokenStream {
    let ident = format_ident!("{module}");
    let rope_scaled = matches!(&plan.consts, crate::plan::Consts::Llama(c) if c.rope_scaling.is_some());
    if module == "rope" && rope_scaled {
        // This model builds its rotary tables from scaled frequencies (rope_table_from).
        quote! {
            #[allow(dead_code, reason = "rope_table is for unscaled frequencies")]
            pub mod #ident;
        }
    } else {
        quote!(pub mod #ident;)
    }
}

pub fn kernels_mod_rs(plan: &Plan) -> TokenStream {
    let name = &plan.name;
    let module_doc = [
        format!(" The kernels chosen for `{name}`, one module per interface, each the source of the"),
        " implementation that resolution picked (README.md says which and why).".to_string(),
    ];
    let mut interfaces: Vec<String> = plan.interfaces.iter().map(|i| i.module()).collect();
    interfaces.sort_unstable();
    let modules = interfaces.iter().map(|i| kernel_module(plan, i));
    let jobs: Vec<TeamJob> = plan
        .interfaces
        .iter()
        .filter_map(|i| Some(TeamJob::new(camel_ident(&i.module()), i.chosen.team_job.as_ref()?)))
        .collect();
    let team_job = team_job_enum(&jobs);
    let shared = (!plan.shared_modules.is_empty()).then(|| {
        let shared = plan.shared_modules.iter().map(|m| format_ident!("{m}"));
        quote! {
            /// Helpers that several kernels share.
            pub mod shared {
                #(pub mod #shared;)*
            }
        }
    });
    let packing = plan.interfaces.iter().find_map(|i| Some((i, i.chosen.packing.as_ref()?))).map(|(i, p)| {
        let layout = &p.layout;
        let doc = [
            format!(
                " The layout in which `{}` reads its weights, as its `pack` writes them: its",
                i.interface
            ),
            " name, version and the sha256 of its source with the shared modules it uses. A saved"
                .to_string(),
            " model's packed matrices are mapped only when the file names this layout (tensor_file.rs)."
                .to_string(),
        ];
        let path: syn::Path = syn::parse_str(&p.packed_len).expect("the registry checks `module::function`");
        let named = path.segments.last().is_some_and(|s| s.ident == "packed_len");
        let alias = (!named).then(|| quote!(as packed_len));
        quote! {
            #(#[doc = #doc])*
            pub(crate) const PACKED_LAYOUT: &str = #layout;

            /// The length of a packed `[n, k]` matrix, as `pack` returns it.
            pub(crate) use shared::#path #alias;
        }
    });
    quote! {
        #(#![doc = #module_doc])*

        #(#modules)*
        #shared
        #packing
        #team_job
    }
}

/// One kernel's job type on the crate's thread team.
pub struct TeamJob {
    /// The enum variant that holds it.
    pub variant: proc_macro2::Ident,
    /// Its path from the kernels module.
    pub path: TokenStream,
}

impl TeamJob {
    /// The job type at `path` (from the kernels module: `shared::avx512_matmul::Product<u16>`),
    /// held by variant `variant`.
    pub fn new(variant: proc_macro2::Ident, path: &str) -> TeamJob {
        let path: syn::Type = syn::parse_str(path).expect("the registry checks that a `team_job` is a type");
        TeamJob { variant, path: path.into_token_stream() }
    }
}

/// `UpperCamelCase` of a snake- or kebab-case name, as an identifier.
pub fn camel_ident(name: &str) -> proc_macro2::Ident {
    let camel: String = name
        .split(['_', '-'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect();
    format_ident!("{camel}")
}

/// `TeamJob`, the work that the crate's thread team (`shared/team.rs`) runs: one variant per
/// job type that kernels hand to it, each delegating to that type. Nothing when no kernel uses
/// the team.
pub fn team_job_enum(jobs: &[TeamJob]) -> Option<TokenStream> {
    if jobs.is_empty() {
        return None;
    }
    // Kernels that hand the team the same type (a shared module's work, at one element type)
    // share its variant: a type converts into the enum one way.
    let mut seen = std::collections::BTreeSet::new();
    let jobs: Vec<&TeamJob> = jobs.iter().filter(|j| seen.insert(j.path.to_string())).collect();
    let variants: Vec<_> = jobs.iter().map(|j| &j.variant).collect();
    let paths: Vec<_> = jobs.iter().map(|j| &j.path).collect();
    Some(quote! {
        /// The work of the kernels that share their calls with the thread team of
        /// `shared/team.rs`, one variant per kernel: the team's workers run whichever the
        /// calling thread published.
        #[derive(Clone, Copy)]
        pub(crate) enum TeamJob {
            #(#variants(#paths),)*
        }

        #(
            impl From<#paths> for TeamJob {
                fn from(job: #paths) -> TeamJob {
                    TeamJob::#variants(job)
                }
            }
        )*

        impl shared::team::Job for TeamJob {
            fn extent(&self) -> shared::team::Extent {
                match self {
                    #(TeamJob::#variants(job) => job.extent(),)*
                }
            }

            unsafe fn columns(&self, cols: std::ops::Range<usize>) {
                // SAFETY: the caller's contract, which each kernel's job shares.
                match self {
                    #(TeamJob::#variants(job) => unsafe { job.columns(cols) },)*
                }
            }
        }
    })
}

/// Gives main.rs the `serve` subcommand of `templates/runtime/serve_main.rs`: its items (its
/// `use`s after main.rs's), and a first statement of `main` that hands `serve ...` to it;
/// `about` is what `serve --help` says the server is, `model` what its `--model` holds.
pub fn add_serve_command(
    main: &mut syn::File,
    templates: &Templates,
    krate: &str,
    (about, model): (&str, &str),
) -> Result<(), Error> {
    let serve = templates.runtime_with(
        "serve_main.rs",
        &[("__crate", krate), ("__serve_about", about), ("__serve_model", model)],
    )?;
    let Some(main_fn) = main.items.iter_mut().find_map(|item| match item {
        syn::Item::Fn(f) if f.sig.ident == "main" => Some(f),
        _ => None,
    }) else {
        return Err(Error::Template {
            name: "runtime/main.rs".into(),
            message: "no `fn main` to add `serve` to".into(),
        });
    };
    let dispatch: syn::Stmt = syn::parse_quote! {
        if std::env::args_os().nth(1).is_some_and(|arg| arg == "serve") {
            return serve();
        }
    };
    main_fn.block.stmts.insert(0, dispatch);
    let (uses, items): (Vec<syn::Item>, Vec<syn::Item>) =
        serve.items.into_iter().partition(|item| matches!(item, syn::Item::Use(_)));
    main.items.extend(items);
    let last_use = main.items.iter().rposition(|item| matches!(item, syn::Item::Use(_))).map_or(0, |i| i + 1);
    main.items.splice(last_use..last_use, uses);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amx_features_are_tested_through_cpuid_and_the_kernel_not_the_unstable_macro() {
        for (feature, bit) in [("amx-tile", "24"), ("amx-bf16", "22"), ("amx-int8", "25")] {
            assert_eq!(feature_detected(feature).to_string(), format!("amx ({bit})"));
        }
        assert_eq!(
            feature_detected("avx512f").to_string(),
            quote!(std::arch::is_x86_feature_detected!("avx512f")).to_string()
        );
        assert!(needs_amx_fn(&["avx2".to_string(), "amx-bf16".to_string()]));
        assert!(!needs_amx_fn(&["avx2".to_string(), "avx512f".to_string()]));
        let amx = amx_fn().to_string();
        assert!(amx.contains("fn amx (bit : u32) -> bool"), "{amx}");
        assert!(amx.contains("0x1023") && amx.contains("XFEATURE_XTILEDATA"), "{amx}");
    }
}
