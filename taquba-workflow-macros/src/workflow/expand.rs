//! Writes the code of a checked `#[workflow]`: the impl block without its
//! `#[step]` markers; the step enum and the input struct (in a hidden
//! module, glob re-exported, so a user item of the same name shadows them
//! and is reported once by the name check instead of clashing); `impl
//! Workflow`, `impl StepRunner`, the bound checks and the registration
//! entry.
//!
//! The impl block and the impls are written in a `const _` block that
//! imports the generated types by name: there the names mean them whatever
//! the module holds, so with an item of the user's of the same name (the
//! name check's one error) the step fns still type-check against the step
//! enum, and are not reported on top. Each field of the step enum is
//! serialized through probes that state no bound, and its bound is checked
//! once, by `StepField` at the parameter's type.
//!
//! With `fallback`, the same types and impls are written with bodies that
//! are never run (`unreachable!`) and without registration: the crate does
//! not compile anyway (an error was reported), but `OrderStep::...` and
//! `Transition<OrderStep>` in the user's code still resolve, so the compile
//! shows the macro's errors instead of a cascade of unresolved names.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::validate::{StepModel, WorkflowModel};
use crate::common::{
    ContextBy, ContextParam, Slot, bound_check, copied_docs, crate_path, inner_type,
    inner_visibility, respan, serde_fns,
};

/// The full expansion of one `#[workflow]`.
pub(crate) fn expand(model: &WorkflowModel, fallback: bool) -> TokenStream {
    let krate = crate_path(model.options.krate.as_ref());
    let item = &model.item;
    let vis = model
        .options
        .vis
        .clone()
        .unwrap_or(syn::Visibility::Inherited);
    let module = module_ident(model);
    let (step_enum, serde_fns) = step_enum(model, &krate);
    let (input, input_impls) = input_struct(model, &krate);
    let workflow_impl = workflow_impl(model, &krate, fallback);
    let names = name_checks(model, &krate);
    let registration = if fallback {
        TokenStream::new()
    } else {
        registration(model, &krate)
    };
    let (enum_ident, input_ident) = (&model.step_enum, &model.input);
    quote! {
        #[doc(hidden)]
        #[allow(deprecated)]
        mod #module {
            #[allow(unused_imports)]
            use super::*;

            #step_enum
            #input

            impl #krate::__private::GeneratedStepEnum for #enum_ident {}
            impl #krate::__private::GeneratedInput for #input_ident {}

            #serde_fns
        }
        #vis use #module::*;

        const _: () = {
            #[allow(unused_imports)]
            use #module::{#enum_ident, #input_ident};

            #item
            #input_impls
            #workflow_impl
        };
        #[allow(deprecated)]
        const _: () = {
            #names
            #registration
        };
    }
}

fn module_ident(model: &WorkflowModel) -> Ident {
    format_ident!(
        "__taquba_workflow_{}",
        model.type_ident.unraw().to_string().to_lowercase()
    )
}

/// `path::Name` of a generated type, as the code outside the module
/// names it.
fn generated(model: &WorkflowModel, ident: &Ident) -> TokenStream {
    let module = module_ident(model);
    quote!(#module::#ident)
}

fn inner_vis(model: &WorkflowModel) -> TokenStream {
    inner_visibility(
        &model
            .options
            .vis
            .clone()
            .unwrap_or(syn::Visibility::Inherited),
    )
}

fn serde_path(krate: &TokenStream) -> String {
    format!("{}::__private::serde", krate.to_string().replace(' ', ""))
}

/// The step enum, and the fns its fields are serialized with.
fn step_enum(model: &WorkflowModel, krate: &TokenStream) -> (TokenStream, TokenStream) {
    let vis = inner_vis(model);
    let ident = &model.step_enum;
    let type_ident = &model.type_ident;
    let derives = &model.options.derives;
    let serde_path = serde_path(krate);
    let doc = format!(
        " The steps of the `{}` workflow: one variant per `#[step]` fn of `{type_ident}`, whose fields are that step's parameters.",
        model.name
    );
    let doc_storage = " A variant is stored under its step's name, so runs in flight survive steps being added, removed or reordered. Move a run on with `Transition::next` and friends.";
    let mut fns = TokenStream::new();
    let variants: Vec<TokenStream> = model
        .steps
        .iter()
        .enumerate()
        .map(|(step_index, step)| {
            let cfgs = &step.cfgs;
            let name = &step.name;
            let variant = &step.variant;
            let default_doc = format!(
                " The `{name}` step: runs `{type_ident}::{}`.",
                step.fn_ident
            );
            let docs = if step.docs.is_empty() {
                quote!(#[doc = #default_doc])
            } else {
                copied_docs(&step.docs.iter().collect::<Vec<_>>())
            };
            let fields: Vec<TokenStream> = step
                .params
                .iter()
                .enumerate()
                .map(|(field_index, param)| {
                    let field = &param.ident;
                    let ty = inner_type(&param.field_ty);
                    let attrs = &param.field_attrs;
                    let doc = (!attrs.iter().any(|a| a.path().is_ident("doc"))).then(|| {
                        let text =
                            format!(" The `{}` parameter of `{}`.", param.name(), step.fn_ident);
                        quote!(#[doc = #text])
                    });
                    // Serialized through fns that state no bound: the field's bound
                    // is checked once, by `name_checks`.
                    let all_cfgs: Vec<_> = step.cfgs.iter().chain(&param.cfgs).cloned().collect();
                    let serde = serde_fns(
                        &format!("{step_index}_{field_index}"),
                        &ty,
                        &all_cfgs,
                        krate,
                    );
                    fns.extend(serde.fns);
                    let with = serde.attr;
                    quote!(#doc #(#attrs)* #with #field: #ty)
                })
                .collect();
            let aliases = &step.aliases;
            quote! {
                #(#cfgs)*
                #docs
                #[serde(rename = #name #(, alias = #aliases)*)]
                #variant { #(#fields,)* },
            }
        })
        .collect();
    let step_enum = quote! {
        #[doc = #doc]
        #[doc = ""]
        #[doc = #doc_storage]
        #[derive(#krate::__private::serde::Serialize, #krate::__private::serde::Deserialize #(, #derives)*)]
        #[serde(crate = #serde_path)]
        #vis enum #ident {
            #(#variants)*
        }
    };
    (step_enum, fns)
}

/// The input struct (in the module) and its impls (outside).
fn input_struct(model: &WorkflowModel, krate: &TokenStream) -> (TokenStream, TokenStream) {
    let vis = inner_vis(model);
    let ident = &model.input;
    let input_path = generated(model, ident);
    let step_enum = generated(model, &model.step_enum);
    // Without a start step (an error), the first step stands in, the likely
    // one (the error suggests it), so `OrderInput { .. }` in the user's
    // code does not cascade.
    let input_step = model
        .start
        .or_else(|| (!model.steps.is_empty()).then_some(0));
    let Some(start) = input_step.map(|i| &model.steps[i]) else {
        // Only with errors: a stand-in so `Workflow::Input` resolves.
        return (
            quote!(#vis struct #ident;),
            quote! {
                #[allow(deprecated)]
                impl ::core::convert::From<#input_path> for #step_enum {
                    fn from(_: #input_path) -> Self {
                        ::core::unreachable!("`#[workflow]` reported an error")
                    }
                }
                #[allow(deprecated)]
                impl #krate::workflows::WorkflowInput for #input_path {
                    type Step = #step_enum;
                }
            },
        );
    };
    let variant = &start.variant;
    let derives = &model.options.derives;
    let derive = if derives.is_empty() {
        TokenStream::new()
    } else {
        quote!(#[derive(#(#derives),*)])
    };
    let doc = format!(
        " The input of the `{}` workflow: the parameters of its start step `{}`. Submit it with `WorkflowRuntime::start`.",
        model.name, start.name
    );
    let fields = start.params.iter().map(|param| {
        let field = &param.ident;
        let ty = inner_type(&param.field_ty);
        // The input struct is not serialized: a `#[serde(default)]` is the
        // stored step's business.
        let attrs: Vec<_> = param
            .field_attrs
            .iter()
            .filter(|a| !a.path().is_ident("serde"))
            .collect();
        let doc = (!attrs.iter().any(|a| a.path().is_ident("doc"))).then(|| {
            let text = format!(" The `{}` parameter of `{}`.", param.name(), start.fn_ident);
            quote!(#[doc = #text])
        });
        // The field's visibility at the parameter's name, so the field (a
        // derive's error on it) is located at the parameter.
        let field_vis = respan(&vis, field.span());
        quote!(#doc #(#attrs)* #field_vis #field: #ty)
    });
    let body = if start.params.is_empty() {
        quote!(;)
    } else {
        quote!({ #(#fields,)* })
    };
    let input = Ident::new("__taquba_input", Span::mixed_site());
    let moves = start.params.iter().map(|param| {
        let field = &param.ident;
        let cfgs = &param.cfgs;
        quote!(#(#cfgs)* #field: #input.#field)
    });
    let input_pat = if start.params.is_empty() {
        quote!(_)
    } else {
        quote!(#input)
    };
    (
        quote! {
            #[doc = #doc]
            #derive
            #vis struct #ident #body
        },
        quote! {
            #[allow(deprecated)]
            impl ::core::convert::From<#input_path> for #step_enum {
                fn from(#input_pat: #input_path) -> Self {
                    #step_enum::#variant { #(#moves,)* }
                }
            }

            #[allow(deprecated)]
            impl #krate::workflows::WorkflowInput for #input_path {
                type Step = #step_enum;
            }
        },
    )
}

fn workflow_impl(model: &WorkflowModel, krate: &TokenStream, fallback: bool) -> TokenStream {
    let self_ty = &model.self_ty;
    let step_enum = generated(model, &model.step_enum);
    let name = &model.name;
    // `Workflow::Output` is bounded by one trait (`WorkflowOutput`), checked
    // here, at the type's span: an output type that is not serializable is
    // one error, there. The type itself is named as written, so a
    // `Transition::done(...)` of the user's normalizes to it without
    // checking the bound again.
    let output_item = match &model.options.output {
        Some(ty) => quote_spanned!(ty.span()=> type Output = #ty;),
        None => quote!(
            type Output = ();
        ),
    };
    let step = Ident::new("__taquba_step", Span::mixed_site());
    // The crate's version by default: `env!` expands in the user's crate.
    let version = match &model.options.version {
        Some(version) => quote!(#version),
        None => quote!(::core::env!("CARGO_PKG_VERSION")),
    };
    let patches = &model.options.patches;
    let start_name = model
        .start
        .map(|i| model.steps[i].name.clone())
        .unwrap_or_default();
    let names = model.steps.iter().map(|s| {
        let cfgs = &s.cfgs;
        let name = &s.name;
        quote!(#(#cfgs)* #name)
    });
    let aliases = model.steps.iter().flat_map(|s| {
        let cfgs = &s.cfgs;
        let name = &s.name;
        s.aliases
            .iter()
            .map(move |alias| quote!(#(#cfgs)* (#alias, #name)))
    });
    let name_arms = model.steps.iter().map(|s| {
        let cfgs = &s.cfgs;
        let variant = &s.variant;
        let name = &s.name;
        quote!(#(#cfgs)* #step_enum::#variant { .. } => #name,)
    });
    let (name_body, run_step_body) = if fallback {
        let unreachable = quote!(::core::unreachable!("`#[workflow]` reported an error"));
        (
            quote!({ #unreachable }),
            quote!({ let _ = #step; async { #unreachable } }),
        )
    } else {
        let arms = model
            .steps
            .iter()
            .map(|s| dispatch_arm(model, s, krate, &step));
        (
            quote!({ match self { #(#name_arms)* } }),
            quote!({
                async move {
                    #[allow(unused_imports)]
                    use #krate::__private::{StepErrorViaDisplay as _, StepErrorViaInto as _};
                    match #krate::__private::decode_step::<#step_enum>(#step)? {
                        #(#arms)*
                    }
                }
            }),
        )
    };
    quote! {
        #[allow(deprecated)]
        impl #krate::workflows::WorkflowStep for #step_enum {
            type Workflow = #self_ty;

            fn name(&self) -> &'static str #name_body
        }

        #[allow(deprecated)]
        impl #krate::workflows::Workflow for #self_ty {
            const NAME: &'static str = #name;
            const START: &'static str = #start_name;
            const STEPS: &'static [&'static str] = &[#(#names),*];
            const ALIASES: &'static [(&'static str, &'static str)] = &[#(#aliases),*];
            const VERSION: ::core::option::Option<&'static str> =
                ::core::option::Option::Some(#version);
            const PATCHES: &'static [&'static str] = &[#(#patches),*];
            #output_item
        }

        #[allow(deprecated)]
        impl #krate::StepRunner for #self_ty {
            fn run_step(
                &self,
                #step: &#krate::Step,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<#krate::StepOutcome, #krate::StepError>,
            > + ::core::marker::Send #run_step_body

            fn hosted(&self) -> #krate::Hosted {
                #krate::__private::hosted_workflow::<Self>()
            }

            fn code(&self) -> #krate::versioning::HostedCode {
                #krate::__private::workflow_code::<Self>()
            }
        }
    }
}

fn dispatch_arm(
    model: &WorkflowModel,
    step: &StepModel,
    krate: &TokenStream,
    step_ident: &Ident,
) -> TokenStream {
    let step_enum = generated(model, &model.step_enum);
    let variant = &step.variant;
    let cfgs = &step.cfgs;
    let name = &step.name;
    let bindings: Vec<Ident> = (0..step.params.len())
        .map(|i| format_ident!("__taquba_arg{}", i, span = Span::mixed_site()))
        .collect();
    let fields = step.params.iter().zip(&bindings).map(|(param, binding)| {
        let field = &param.ident;
        let cfgs = &param.cfgs;
        quote!(#(#cfgs)* #field: #binding)
    });
    let receiver = step.receiver.then(|| quote!(self));
    let args = step.slots.iter().map(|slot| match slot {
        Slot::Context(ContextParam { cfgs, by }) => {
            let reference = match by {
                ContextBy::Value => quote!(),
                ContextBy::Ref => quote!(&),
                ContextBy::Mut => quote!(&mut),
            };
            // A temporary lent to the call lives to the end of the arm,
            // past the `.await`.
            quote! {
                #(#cfgs)*
                #reference #krate::workflows::StepContext::new(
                    #step_ident,
                    <Self as #krate::workflows::Workflow>::NAME,
                    #name,
                )
            }
        }
        Slot::Field(i) => {
            let binding = &bindings[*i];
            let cfgs = &step.params[*i].cfgs;
            if step.params[*i].by_ref {
                quote!(#(#cfgs)* &#binding)
            } else {
                quote!(#(#cfgs)* #binding)
            }
        }
    });
    let all_args = receiver.into_iter().chain(args);
    let fn_ident = &step.fn_ident;
    let call = quote_spanned! {fn_ident.span()=>
        #krate::__private::step_future(Self::#fn_ident(#(#all_args),*))
    };
    let ret = &step.ret;
    let ret_span = ret.span();
    // Everything that names the return type's parts is located at the
    // return type, the runtime crate's path included (an expression's span
    // starts at its first token), so a wrong return type is one error
    // there.
    let at_ret = respan(krate, ret_span);
    // The step enum as the step fns name it: written in the `const _`
    // block that imports the generated enum by name, this is the generated
    // enum even when an item of the user's has the name in the module (the
    // name check's one error), so the step fns type-check against it.
    let named_enum = &model.step_enum;
    // At the return type, in its context: an expression mixing syntax
    // contexts (a `mixed_site` binding among the return type's tokens) is
    // located at the attribute. Only generated code sees the name.
    let error = Ident::new("__taquba_error", ret_span);
    // `Into<StepError>` when the error has it, else `Display` (transient);
    // the fallback's bound is checked at the return type.
    let convert = quote_spanned! {ret_span=>
        |#error| (&#at_ret::__private::step_error_probe(&#error)).step_error_kind().convert(#error)
    };
    let handled = quote_spanned! {ret_span=>
        #at_ret::__private::step_outcome::<#step_enum, #named_enum, #ret>(#call.await, #convert)
    };
    quote! {
        #(#cfgs)*
        #step_enum::#variant { #(#fields,)* } => #handled,
    }
}

/// Checks that the generated types' names still mean them in the user's
/// module (see `GeneratedStepEnum`), and the bound of each field of the
/// step enum (`StepField`), once, at its parameter's type.
fn name_checks(model: &WorkflowModel, krate: &TokenStream) -> TokenStream {
    let enum_ident = &model.step_enum;
    let input_ident = &model.input;
    let enum_check = quote_spanned!(enum_ident.span()=>
        #krate::__private::generated_step_enum::<#enum_ident>());
    let input_check = quote_spanned!(input_ident.span()=>
        #krate::__private::generated_input::<#input_ident>());
    let field_checks = model.steps.iter().flat_map(|step| {
        step.params.iter().map(|param| {
            let cfgs: Vec<_> = step.cfgs.iter().chain(&param.cfgs).cloned().collect();
            bound_check(&param.field_ty, "StepField", &cfgs, krate)
        })
    });
    quote!(#enum_check; #input_check; #(#field_checks)*)
}

fn registration(model: &WorkflowModel, krate: &TokenStream) -> TokenStream {
    let self_ty = &model.self_ty;
    let name = &model.name;
    let type_name = model.type_ident.to_string();
    // At the attribute: see the job's registration.
    let file = quote!(::core::file!());
    let line = quote!(::core::line!());
    quote! {
        fn __taquba_make() -> ::core::option::Option<
            ::std::boxed::Box<dyn #krate::__private::ErasedWorkflow>,
        > {
            #[allow(unused_imports)]
            use #krate::__private::{MakeWithDefault as _, MakeWithoutDefault as _};
            (&#krate::__private::Maker::<#self_ty>::new()).make()
        }

        #krate::__private::inventory::submit! {
            #krate::__private::WorkflowRegistration {
                // The name itself, not `Workflow::NAME`: naming the impl
                // would report its missing bounds once more.
                name: #name,
                type_name: #type_name,
                module_path: ::core::module_path!(),
                file: #file,
                line: #line,
                make: __taquba_make,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use quote::{ToTokens, quote};

    use crate::common::Errors;
    use crate::workflow::{parse, validate};

    fn expand(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        let item: syn::ItemImpl = syn::parse2(item).unwrap();
        let mut errors = Errors::new();
        let options = parse::parse(attr, &mut errors);
        let (_, model) = validate::validate(item, options, &mut errors);
        assert!(errors.is_empty(), "{:?}", errors.messages());
        let file: syn::File = syn::parse2(super::expand(&model.unwrap(), false)).unwrap();
        file.to_token_stream().to_string()
    }

    const ORDER: &str = r#"
        impl Order {
            /// Charges the card.
            #[step(start)]
            async fn charge(&self, ctx: StepContext<'_>, order_id: &str, cents: u64) -> Result<Transition<OrderStep>, StepError> {}
            #[cfg(feature = "ship")]
            #[step(name = "ship_it")]
            async fn ship(order_id: String) -> Result<Transition<OrderStep>, StepError> {}
        }
    "#;

    #[test]
    fn the_enum_has_one_renamed_variant_per_step() {
        let out = expand(quote!(output = Receipt), ORDER.parse().unwrap());
        assert!(out.contains("pub (super) enum OrderStep {"), "{out}");
        assert!(out.contains("# [serde (rename = \"charge\")] Charge { # [doc = \" The `order_id` parameter of `charge`.\"] # [serde (serialize_with = \"__taquba_ser_0_0\" , deserialize_with = \"__taquba_de_0_0\")] order_id : :: std :: string :: String"), "{out}");
        // The serde fns of a `#[cfg]`'d step are too, and each field's bound
        // is checked once.
        assert!(
            out.contains("# [cfg (feature = \"ship\")] fn __taquba_ser_1_0"),
            "{out}"
        );
        assert!(
            out.contains(
                "let _ = < u64 as :: taquba_workflow :: __private :: StepField > :: check ;"
            ),
            "{out}"
        );
        assert!(
            out.contains("# [cfg (feature = \"ship\")] let _ = < String as :: taquba_workflow :: __private :: StepField > :: check ;"),
            "{out}"
        );
        assert!(out.contains("# [cfg (feature = \"ship\")] # [doc = \" The `ship_it` step: runs `Order::ship`.\"] # [serde (rename = \"ship_it\")] Ship"), "{out}");
        // The step fn's docs, outside doctest builds (an example in them is
        // collected once, from the fn).
        assert!(
            out.contains("# [cfg_attr (not (doctest) , doc = \" Charges the card.\")] # [serde (rename = \"charge\")]"),
            "{out}"
        );
        assert!(!out.contains("# [step"), "{out}");
    }

    #[test]
    fn aliases_are_serde_aliases_and_listed() {
        let source = ORDER.replace(
            "#[step(start)]",
            "#[step(start, alias = \"pay\", alias = \"bill\")]",
        );
        assert_ne!(source, ORDER, "the fixture has a start step");
        let out = expand(quote!(), source.parse().unwrap());
        assert!(
            out.contains(
                "# [serde (rename = \"charge\" , alias = \"pay\" , alias = \"bill\")] Charge"
            ),
            "{out}"
        );
        assert!(
            out.contains("const ALIASES : & 'static [(& 'static str , & 'static str)] = & [(\"pay\" , \"charge\") , (\"bill\" , \"charge\")]"),
            "{out}"
        );
    }

    #[test]
    fn the_input_is_the_start_steps_parameters() {
        let out = expand(quote!(vis = pub(crate)), ORDER.parse().unwrap());
        assert!(out.contains("pub (crate) struct OrderInput { # [doc = \" The `order_id` parameter of `charge`.\"] pub (crate) order_id : :: std :: string :: String"), "{out}");
        assert!(out.contains("impl :: core :: convert :: From < __taquba_workflow_order :: OrderInput > for __taquba_workflow_order :: OrderStep"), "{out}");
        assert!(out.contains("type Step = __taquba_workflow_order :: OrderStep"));
        assert!(
            out.contains("pub (crate) use __taquba_workflow_order :: * ;"),
            "{out}"
        );
        assert!(out.contains("type Output = ()"));
        let out = expand(quote!(output = Receipt), ORDER.parse().unwrap());
        // The type as written: its bound (`WorkflowOutput`) is checked once,
        // by the trait, at this type.
        assert!(out.contains("type Output = Receipt ;"), "{out}");
    }

    #[test]
    fn dispatch_calls_each_step_with_its_fields() {
        let out = expand(quote!(name = "order"), ORDER.parse().unwrap());
        assert!(out.contains("const NAME : & 'static str = \"order\""));
        assert!(
            out.contains("const STEPS : & 'static [& 'static str] = & [\"charge\" , # [cfg (feature = \"ship\")] \"ship_it\"]"),
            "{out}"
        );
        assert!(
            out.contains("Self :: charge (self , :: taquba_workflow :: workflows :: StepContext :: new (__taquba_step , < Self as :: taquba_workflow :: workflows :: Workflow > :: NAME , \"charge\" ,) , & __taquba_arg0 , __taquba_arg1)"),
            "{out}"
        );
        assert!(out.contains("Self :: ship (__taquba_arg0)"), "{out}");
        // What the runner hosts, which the inbox and the test kit check names against.
        assert!(
            out.contains("fn hosted (& self) -> :: taquba_workflow :: Hosted { :: taquba_workflow :: __private :: hosted_workflow :: < Self > () }"),
            "{out}"
        );
        // The generated enum, the enum's name as the module sees it, and the
        // return type as written.
        assert!(out.contains(
            "step_outcome :: < __taquba_workflow_order :: OrderStep , OrderStep , Result < Transition < OrderStep > , StepError > >"
        ), "{out}");
        assert!(
            out.contains("generated_step_enum :: < OrderStep > ()"),
            "{out}"
        );
        assert!(out.contains("inventory :: submit !"));
    }

    #[test]
    fn the_impl_block_sees_the_generated_types_by_name() {
        let out = expand(quote!(), ORDER.parse().unwrap());
        assert!(
            out.contains("const _ : () = { # [allow (unused_imports)] use __taquba_workflow_order :: { OrderStep , OrderInput } ; impl Order {"),
            "{out}"
        );
        // The name checks are outside it, where the names are the module's.
        assert!(
            out.contains("# [allow (deprecated)] const _ : () = { :: taquba_workflow :: __private :: generated_step_enum :: < OrderStep > ()"),
            "{out}"
        );
    }

    #[test]
    fn the_crate_path_is_configurable() {
        let out = expand(quote!(crate = ::renamed), ORDER.parse().unwrap());
        assert!(
            out.contains("impl :: renamed :: StepRunner for Order"),
            "{out}"
        );
        assert!(out.contains("\"::renamed::__private::serde\""), "{out}");
        assert!(!out.contains("taquba_workflow ::"), "{out}");
    }

    #[test]
    fn the_context_is_lent_as_the_step_takes_it() {
        let out = expand(
            quote!(),
            quote!(impl Order {
                #[step(start)]
                async fn a(ctx: &StepContext<'_>, n: u8) -> Result<Transition<OrderStep>, StepError> {}
                #[step]
                async fn b(self: &Self, ctx: &mut StepContext<'_>, me: Vec<Self>) -> Result<Transition<OrderStep>, StepError> {}
            }),
        );
        assert!(
            out.contains("Self :: a (& :: taquba_workflow :: workflows :: StepContext :: new ("),
            "{out}"
        );
        assert!(
            out.contains(
                "Self :: b (self , & mut :: taquba_workflow :: workflows :: StepContext :: new ("
            ),
            "{out}"
        );
        // `Self` is the workflow type in the step enum, outside the impl.
        assert!(out.contains("me : Vec < Order >"), "{out}");
    }

    #[test]
    fn fallback_keeps_the_types_and_drops_the_registration() {
        let item: syn::ItemImpl = syn::parse2(ORDER.parse().unwrap()).unwrap();
        let mut errors = Errors::new();
        let (_, model) = validate::validate(item, Default::default(), &mut errors);
        let out = super::expand(&model.unwrap(), true).to_string();
        assert!(out.contains("enum OrderStep"));
        assert!(out.contains("unreachable !"));
        assert!(!out.contains("inventory"));
    }
}
