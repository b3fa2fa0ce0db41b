//! Writes the code of a checked `#[job]` fn: the fn as written, the job
//! struct (in a hidden module, glob re-exported), `impl GeneratedJob`
//! (`Job` follows from it), the check that the struct's name is not taken,
//! the fields' bound checks and the registration entry.
//!
//! Every bound is checked once, at the user's token: the return type as
//! `GeneratedJob::Return` (whose bounds say it is a `Result` with a stored
//! output and error; nothing else names its parts), each field by its
//! marker trait `JobField` / `JobFieldOwned` at its parameter's type (the
//! struct is serialized and the field cloned through probes that state no
//! bound), `classify` by its coercion to a fn pointer (at its path).

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::validate::JobModel;
use crate::common::{
    ContextBy, ContextParam, Piece, Slot, bound_check, cfg_attrs, copied_docs, crate_path,
    doc_attrs, inner_type, inner_visibility, respan, serde_fns,
};

/// The full expansion of one `#[job]`; `func` is the fn as re-emitted.
pub(crate) fn expand(model: &JobModel, func: &syn::ItemFn) -> TokenStream {
    let krate = crate_path(model.options.krate.as_ref());
    let fn_ident = &func.sig.ident;
    let vis = &func.vis;
    let inner_vis = inner_visibility(vis);
    let ident = &model.struct_ident;
    // At the call site: at the fn's name, the paths through the module
    // (`__taquba_job_x::X`) would be the user's, and `unused_qualifications`
    // would flag them.
    let module = format_ident!(
        "__taquba_job_{}",
        fn_ident.unraw(),
        span = Span::call_site()
    );
    let cfgs = cfg_attrs(&func.attrs);
    let krate_string = krate.to_string().replace(' ', "");
    let serde_path = format!("{krate_string}::__private::serde");

    // The struct.
    let docs = doc_attrs(&func.attrs);
    // A deprecated job fn makes a deprecated job: the struct is what
    // callers submit. The generated code that names it allows it.
    let deprecated = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("deprecated"));
    let doc_block = if docs.is_empty() {
        let text = format!(" The `{}` job: the parameters of `{fn_ident}`.", model.name);
        quote!(#[doc = #text])
    } else {
        copied_docs(&docs)
    };
    let generated_note = format!(
        " The fields are the parameters of `{fn_ident}`; `#[job]` generated this type, its `Job` impl and its registration."
    );
    let derives = &model.options.derives;
    // Each field is serialized through fns beside the struct, which state no
    // bound: the field's bounds are checked once, below (`checks`).
    let serde: Vec<_> = model
        .params
        .iter()
        .enumerate()
        .map(|(index, param)| {
            serde_fns(
                &index.to_string(),
                &inner_type(&param.field_ty),
                &param.cfgs,
                &krate,
            )
        })
        .collect();
    let serde_fns = serde.iter().map(|fns| &fns.fns);
    let fields = model.params.iter().zip(&serde).map(|(param, serde)| {
        let field = &param.ident;
        let ty = inner_type(&param.field_ty);
        let attrs = &param.field_attrs;
        let doc = (!attrs.iter().any(|a| a.path().is_ident("doc"))).then(|| {
            let text = format!(" The `{}` parameter of `{fn_ident}`.", param.name());
            quote!(#[doc = #text])
        });
        let with = &serde.attr;
        // The field's visibility at the parameter's name, so the field (a
        // derive's error on it) is located at the parameter.
        let field_vis = respan(&inner_vis, field.span());
        quote!(#doc #(#attrs)* #with #field_vis #field: #ty)
    });
    let checks = model.params.iter().map(|param| {
        let check = if param.by_ref {
            "JobField"
        } else {
            "JobFieldOwned"
        };
        bound_check(&param.field_ty, check, &param.cfgs, &krate)
    });
    let body = if model.params.is_empty() {
        quote!(;)
    } else {
        quote!({ #(#fields,)* })
    };
    let item_module = quote! {
        #(#cfgs)*
        #[doc(hidden)]
        mod #module {
            #[allow(unused_imports)]
            use super::*;

            #doc_block
            #[doc = ""]
            #[doc = #generated_note]
            #[derive(#krate::__private::serde::Serialize, #krate::__private::serde::Deserialize #(, #derives)*)]
            #[serde(crate = #serde_path)]
            #(#deprecated)*
            #inner_vis struct #ident #body

            #[allow(deprecated)]
            impl #krate::__private::GeneratedJobStruct for #ident {}

            #(#serde_fns)*
        }
        #(#cfgs)*
        #vis use #module::*;
    };
    let path = quote!(#module::#ident);

    // impl GeneratedJob.
    let ret = &model.ret;
    let ret_span = ret.span();
    let name = &model.name;
    let ctx = Ident::new("__taquba_ctx", Span::mixed_site());
    let contexts: Vec<ContextBy> = model
        .slots
        .iter()
        .filter_map(|s| match s {
            Slot::Context(context) => Some(context.by),
            Slot::Field(_) => None,
        })
        .collect();
    let ctx_pat = if contexts.contains(&ContextBy::Mut) {
        quote!(mut #ctx)
    } else if contexts.is_empty() {
        quote!(_)
    } else {
        quote!(#ctx)
    };
    let args = model.slots.iter().map(|slot| match slot {
        Slot::Context(ContextParam { cfgs, by }) => match by {
            ContextBy::Value => quote!(#(#cfgs)* #ctx),
            ContextBy::Ref => quote!(#(#cfgs)* &#ctx),
            ContextBy::Mut => quote!(#(#cfgs)* &mut #ctx),
        },
        Slot::Field(index) => {
            let param = &model.params[*index];
            let field = &param.ident;
            let cfgs = &param.cfgs;
            if param.by_ref {
                quote!(#(#cfgs)* &self.#field)
            } else {
                // Cloned for each attempt, through the probe (the bound is
                // the field's check).
                let ty = &param.field_ty;
                quote!(#(#cfgs)* (&#krate::__private::FieldProbe::<#ty>::new()).clone_via().clone_value(&self.#field))
            }
        }
    });
    let call = quote_spanned!(fn_ident.span()=> #fn_ident(#(#args),*));
    let key_fn = key_fn(model, &krate);
    let concurrency_fns = concurrency_fns(model, &krate);
    let attempts_fn = model.options.max_attempts.as_ref().map(|n| {
        quote! {
            fn max_attempts(&self) -> ::core::option::Option<u32> {
                ::core::option::Option::Some(#n)
            }
        }
    });
    let classify_fn = model.options.classify.as_ref().map(|classify| {
        let error = Ident::new("__taquba_error", Span::mixed_site());
        let slot = Ident::new("__taquba_classify", Span::mixed_site());
        // Assigned to a `Classify<E>` for the return type's `E` (to any
        // `Classify<X>` when the return type is not a `Result`, which its
        // own check reports): a wrong signature is one error, at `classify`.
        quote! {
            fn classify(&self, #error: &dyn ::core::any::Any) -> #krate::StepErrorKind {
                #[allow(unused_imports)]
                use #krate::__private::{ClassifyOther as _, ClassifyResult as _};
                #[allow(unused_assignments)]
                let mut #slot = (&#krate::__private::ClassifyProbe::<#ret>::new()).slot();
                #slot = #classify;
                #krate::__private::classify_with(#slot, #error)
            }
        }
    });
    // The return type as written, named once: its bounds (a `Result`, with
    // a stored output and error) are `GeneratedJob::Return`'s, so a wrong
    // one is one error, there. The future is `Send` at the return type too.
    let call_ret = quote_spanned!(ret_span=>
        impl ::core::future::Future<Output = Self::Return> + ::core::marker::Send);
    let uses_probe = model.params.iter().any(|p| !p.by_ref);
    let probe_imports = uses_probe.then(|| {
        quote! {
            #[allow(unused_imports)]
            use #krate::__private::{ProbeClone as _, ProbeCloneUnchecked as _};
        }
    });
    let item_impl = quote! {
        #(#cfgs)*
        #[allow(deprecated)]
        impl #krate::__private::GeneratedJob for #path {
            type Return = #ret;
            const NAME: &'static str = #name;

            // A `()` parameter is cloned as any other (a unit value passed
            // to the fn).
            #[allow(clippy::unit_arg)]
            fn call(
                &self,
                #ctx_pat: #krate::jobs::JobContext<'_>,
            ) -> #call_ret {
                #probe_imports
                // The call is made inside the block: a fn whose parameters
                // share one lifetime (`fn f<'a>(ctx: JobContext<'a>, name:
                // &'a str)`) borrows the context and the job for one
                // region, which only the block can name.
                async move { #call.await }
            }

            #key_fn
            #concurrency_fns
            #attempts_fn
            #classify_fn
        }
    };

    // The name check and the registration entry.
    let name_check = quote_spanned!(ident.span()=>
        #krate::__private::generated_job_struct::<#ident>());
    let type_name = ident.to_string();
    // At the attribute (its line): at the user's tokens these absolute
    // paths would be the user's, and `unused_qualifications` would flag
    // them.
    let file = quote!(::core::file!());
    let line = quote!(::core::line!());
    let registration = quote! {
        #(#cfgs)*
        #[allow(deprecated)]
        const _: () = {
            #name_check;
            #(#checks)*
            #krate::__private::inventory::submit! {
                #krate::__private::JobRegistration {
                    // The name itself, not `Job::NAME`: naming the impl
                    // would report its missing bounds once more.
                    name: #name,
                    type_name: #type_name,
                    module_path: ::core::module_path!(),
                    file: #file,
                    line: #line,
                    register: #krate::__private::register_job::<#path>,
                }
            }
        };
    };

    quote! {
        #func
        #item_module
        #item_impl
        #registration
    }
}

fn key_fn(model: &JobModel, krate: &TokenStream) -> Option<TokenStream> {
    if model.options.idempotent.is_some() {
        return Some(quote! {
            fn idempotency_key(&self) -> ::core::option::Option<::std::string::String> {
                #krate::jobs::payload_idempotency_key(self).ok()
            }
        });
    }
    let pieces = model.key.as_ref()?;
    let lit = model.options.key.as_ref()?;
    let formatted = template_expr(model, pieces, lit, krate);
    Some(quote! {
        fn idempotency_key(&self) -> ::core::option::Option<::std::string::String> {
            ::core::option::Option::Some(#formatted)
        }
    })
}

/// `Job::concurrency_key` and `Job::concurrency_limit` from
/// `concurrency_key = "..."` and `limit = n` (default 1).
fn concurrency_fns(model: &JobModel, krate: &TokenStream) -> Option<TokenStream> {
    let pieces = model.concurrency_key.as_ref()?;
    let lit = model.options.concurrency_key.as_ref()?;
    let formatted = template_expr(model, pieces, lit, krate);
    let limit = model
        .options
        .limit
        .as_ref()
        .map_or_else(|| quote!(1), |limit| quote!(#limit));
    Some(quote! {
        fn concurrency_key(&self) -> ::core::option::Option<::std::string::String> {
            ::core::option::Option::Some(#formatted)
        }
        fn concurrency_limit(&self) -> u32 {
            #limit
        }
    })
}

/// The `String` a key template (`lit`, parsed as `pieces`) makes of the
/// job's fields: the text itself for a constant template.
fn template_expr(
    model: &JobModel,
    pieces: &[Piece],
    lit: &syn::LitStr,
    krate: &TokenStream,
) -> TokenStream {
    let span = lit.span();
    // A constant key (a singleton job): the text itself.
    if !pieces.iter().any(|p| matches!(p, Piece::Field { .. })) {
        let text: String = pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.as_str(),
                Piece::Field { .. } => "",
            })
            .collect();
        let text = syn::LitStr::new(&text, span);
        return quote!(::std::string::String::from(#text));
    }
    let mut format = String::new();
    let mut args = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Piece::Field { name, spec } => {
                if spec.is_empty() {
                    format.push_str("{}");
                } else {
                    format.push_str(&format!("{{:{spec}}}"));
                }
                if let Some(param) = model.params.iter().find(|p| p.name() == *name) {
                    // At the template, so a field that cannot be formatted
                    // is one error there (not one spanning the parameter).
                    let mut field = param.ident.clone();
                    field.set_span(span);
                    let at = respan(krate, span);
                    args.push(if spec.is_empty() {
                        quote_spanned!(span=> #at::__private::key_part(&self.#field))
                    } else {
                        quote_spanned!(span=> self.#field)
                    });
                }
            }
        }
    }
    let format = syn::LitStr::new(&format, span);
    quote_spanned!(span=> ::std::format!(#format #(, #args)*))
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::common::Errors;
    use crate::job::{parse, validate};

    fn expand(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        let func: syn::ItemFn = syn::parse2(item).unwrap();
        let mut errors = Errors::new();
        let options = parse::parse(attr, &mut errors);
        let model = validate::validate(&func, options, &mut errors).unwrap();
        assert!(errors.is_empty(), "{:?}", errors.messages());
        let file: syn::File = syn::parse2(super::expand(&model, &func)).unwrap();
        prettyplease_lite(&file)
    }

    /// Token text with spaces collapsed: stable enough to assert on.
    fn prettyplease_lite(file: &syn::File) -> String {
        quote!(#file).to_string()
    }

    #[test]
    fn struct_fields_follow_parameters() {
        let out = expand(
            quote!(name = "email.send", key = "email:{to}", max_attempts = 4),
            quote!(
                /// Sends one email.
                pub(crate) async fn send_email(
                    ctx: JobContext<'_>,
                    to: &str,
                    mut n: u32,
                ) -> Result<Id, E> {
                }
            ),
        );
        assert!(out.contains("pub (crate) struct SendEmail"), "{out}");
        // Serialized through fns beside the struct, which state no bound.
        assert!(
            out.contains("# [serde (serialize_with = \"__taquba_ser_0\" , deserialize_with = \"__taquba_de_0\")] pub (crate) to : :: std :: string :: String"),
            "{out}"
        );
        assert!(
            out.contains("fn __taquba_ser_0 < __S : :: taquba_workflow :: __private :: serde :: Serializer > (__taquba_value : & :: std :: string :: String"),
            "{out}"
        );
        assert!(
            out.contains("(& :: taquba_workflow :: __private :: FieldProbe :: < :: std :: string :: String > :: new ()) . serde_via () . deserialize (__taquba_deserializer)"),
            "{out}"
        );
        assert!(out.contains("pub (crate) n : u32"), "{out}");
        // The bounds: once per field, and the return type once, as `Return`.
        assert!(
            out.contains("let _ = < :: std :: string :: String as :: taquba_workflow :: __private :: JobField > :: check ;"),
            "{out}"
        );
        assert!(
            out.contains(
                "let _ = < u32 as :: taquba_workflow :: __private :: JobFieldOwned > :: check ;"
            ),
            "{out}"
        );
        assert!(
            out.contains("impl :: taquba_workflow :: __private :: GeneratedJob for __taquba_job_send_email :: SendEmail { type Return = Result < Id , E > ;"),
            "{out}"
        );
        assert!(out.contains("const NAME : & 'static str = \"email.send\""));
        assert!(out.contains("send_email (__taquba_ctx , & self . to , (& :: taquba_workflow :: __private :: FieldProbe :: < u32 > :: new ()) . clone_via () . clone_value (& self . n))"), "{out}");
        assert!(out.contains("\"email:{}\""), "{out}");
        assert!(out.contains(":: core :: option :: Option :: Some (4)"));
        assert!(out.contains("# [doc = r\" Sends one email.\"]"), "{out}");
        // On the struct, outside doctest builds: an example in the docs is
        // collected once, from the fn.
        assert!(
            out.contains(
                "# [cfg_attr (not (doctest) , doc = r\" Sends one email.\")] # [doc = \"\"]"
            ),
            "{out}"
        );
        assert!(out.contains("register_job :: < __taquba_job_send_email :: SendEmail >"));
        // The struct lives in a hidden module, re-exported with the fn's
        // visibility; its name is checked in the fn's module.
        assert!(
            out.contains("pub (crate) use __taquba_job_send_email :: * ;"),
            "{out}"
        );
        assert!(
            out.contains("generated_job_struct :: < SendEmail > ()"),
            "{out}"
        );
    }

    #[test]
    fn a_constant_key_is_the_text_itself() {
        let out = expand(
            quote!(key = "reindex:{{all}}"),
            quote!(
                async fn reindex() -> Result<(), E> {}
            ),
        );
        assert!(
            out.contains("fn idempotency_key (& self) -> :: core :: option :: Option < :: std :: string :: String > { :: core :: option :: Option :: Some (:: std :: string :: String :: from (\"reindex:{all}\")) }"),
            "{out}"
        );
    }

    #[test]
    fn classify_is_coerced_for_the_return_types_error() {
        let out = expand(
            quote!(classify = kinds::of),
            quote!(
                async fn fails() -> Result<(), E> {}
            ),
        );
        assert!(
            out.contains("let mut __taquba_classify = (& :: taquba_workflow :: __private :: ClassifyProbe :: < Result < () , E > > :: new ()) . slot () ; __taquba_classify = kinds :: of ;"),
            "{out}"
        );
    }

    #[test]
    fn the_context_is_lent_as_the_fn_takes_it() {
        let out = expand(
            quote!(),
            quote!(
                async fn by_ref(ctx: &JobContext<'_>) -> Result<(), E> {}
            ),
        );
        assert!(out.contains("fn call (& self , __taquba_ctx :"), "{out}");
        assert!(out.contains("by_ref (& __taquba_ctx)"), "{out}");
        let out = expand(
            quote!(),
            quote!(
                async fn by_mut(n: u8, ctx: &mut JobContext<'_>) -> Result<(), E> {}
            ),
        );
        assert!(
            out.contains("fn call (& self , mut __taquba_ctx :"),
            "{out}"
        );
        assert!(out.contains(", & mut __taquba_ctx)"), "{out}");
    }

    #[test]
    fn a_deprecated_fn_makes_a_deprecated_struct_and_quiet_generated_code() {
        let out = expand(
            quote!(),
            quote!(
                #[deprecated = "gone"]
                async fn old() -> Result<(), E> {}
            ),
        );
        assert!(
            out.contains("# [deprecated = \"gone\"] pub (super) struct Old"),
            "{out}"
        );
        assert!(
            out.contains(
                "# [allow (deprecated)] impl :: taquba_workflow :: __private :: GeneratedJob"
            ),
            "{out}"
        );
        assert!(out.contains("# [allow (deprecated)] const _"), "{out}");
    }

    #[test]
    fn a_job_without_parameters_is_a_unit_struct() {
        let out = expand(
            quote!(),
            quote!(
                async fn tick() -> Result<(), E> {}
            ),
        );
        assert!(out.contains("struct Tick ;"), "{out}");
        assert!(out.contains("fn call (& self , _ :"), "{out}");
    }

    #[test]
    fn cfg_attributes_reach_every_generated_item() {
        let out = expand(
            quote!(),
            quote!(
                #[cfg(feature = "x")]
                async fn tick() -> Result<(), E> {}
            ),
        );
        // The fn, the module, its re-export, the impl and the registration.
        assert_eq!(out.matches("# [cfg (feature = \"x\")]").count(), 5, "{out}");
    }

    #[test]
    fn the_crate_path_is_configurable() {
        let out = expand(
            quote!(crate = ::other),
            quote!(
                async fn tick() -> Result<(), E> {}
            ),
        );
        assert!(
            out.contains(
                "impl :: other :: __private :: GeneratedJob for __taquba_job_tick :: Tick"
            )
        );
        assert!(out.contains("\"::other::__private::serde\""), "{out}");
        assert!(!out.contains("taquba_workflow"));
    }

    #[test]
    fn parameter_attributes_reach_the_field_and_cfg_every_use() {
        let out = expand(
            quote!(),
            quote!(
                async fn f(
                    /// Who.
                    #[allow(unused_mut)]
                    mut to: String,
                    #[cfg(feature = "x")] n: u32,
                    #[cfg_attr(feature = "y", cfg(feature = "z"), allow(dead_code))] m: u8,
                ) -> Result<(), E> {
                }
            ),
        );
        assert!(
            out.contains("# [doc = r\" Who.\"] # [allow (unused_mut)] # [serde"),
            "{out}"
        );
        assert!(out.contains("# [cfg (feature = \"x\")] # [serde"), "{out}");
        // The field's use in the call, its serde fns and its check.
        assert!(
            out.contains("# [cfg (feature = \"x\")] (& :: taquba_workflow :: __private :: FieldProbe :: < u32 > :: new ()) . clone_via () . clone_value (& self . n)"),
            "{out}"
        );
        assert!(
            out.contains("# [cfg (feature = \"x\")] fn __taquba_ser_1"),
            "{out}"
        );
        assert!(
            out.contains(
                "# [cfg (feature = \"x\")] # [allow (single_use_lifetimes)] fn __taquba_de_1"
            ),
            "{out}"
        );
        assert!(
            out.contains("# [cfg (feature = \"x\")] let _ = < u32 as"),
            "{out}"
        );
        // Only the part of a `cfg_attr` that can remove the argument.
        assert!(
            out.contains("# [cfg_attr (feature = \"y\" , cfg (feature = \"z\"))] (& :: taquba_workflow :: __private :: FieldProbe :: < u8 >"),
            "{out}"
        );
    }
}
