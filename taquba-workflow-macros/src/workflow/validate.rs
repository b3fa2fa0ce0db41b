//! Checks the impl block under `#[workflow]` and its `#[step]` fns, and
//! builds the model `expand` writes out.

use std::collections::HashMap;

use quote::format_ident;
use syn::ext::IdentExt;
use syn::{
    Attribute, Ident, ImplItem, ImplItemFn, ItemImpl, LitStr, PathArguments, ReturnType, Type,
    TypePath,
};

use super::parse::{StepOptions, WorkflowOptions, is_step_attr, parse_step};
use crate::common::{
    Errors, Param, ParamRules, Params, Slot, check_generics, derived_ident, first_borrow,
    first_unnamed, pascal_case, replace_self, typed_inputs,
};

/// One checked `#[step]` fn.
pub(crate) struct StepModel {
    /// The fn's name.
    pub(crate) fn_ident: Ident,
    /// The stable name the step is serialized under.
    pub(crate) name: String,
    /// Earlier names runs may be parked under (`#[step(alias = "...")]`).
    pub(crate) aliases: Vec<LitStr>,
    /// The step enum's variant.
    pub(crate) variant: Ident,
    /// Whether the fn takes `&self`.
    pub(crate) receiver: bool,
    /// The variant's fields, in parameter order.
    pub(crate) params: Vec<Param>,
    /// The fn's parameters in order.
    pub(crate) slots: Vec<Slot>,
    /// The return type as written.
    pub(crate) ret: Type,
    /// Whether runs begin here.
    pub(crate) start: bool,
    /// The fn's `#[doc]` and `#[cfg]` attributes.
    pub(crate) docs: Vec<Attribute>,
    pub(crate) cfgs: Vec<Attribute>,
    /// Whether a refused parameter of the step has no stand-in (see
    /// `StandIn`): stand-in types beside the errors would not match the
    /// user's code, so none are written.
    pub(crate) unknown: bool,
}

/// A checked `#[workflow]` impl block.
pub(crate) struct WorkflowModel {
    pub(crate) options: WorkflowOptions,
    /// The impl block with the `#[step]` attributes removed.
    pub(crate) item: ItemImpl,
    /// The workflow type as written after `impl`.
    pub(crate) self_ty: Type,
    /// Its last path segment.
    pub(crate) type_ident: Ident,
    /// `Workflow::NAME`.
    pub(crate) name: String,
    pub(crate) step_enum: Ident,
    pub(crate) input: Ident,
    pub(crate) steps: Vec<StepModel>,
    /// Index of the start step in `steps` (with two, the first: that is an
    /// error; `None` only with errors).
    pub(crate) start: Option<usize>,
}

const RULES: ParamRules<'static> = ParamRules {
    attribute: "#[step]",
    what: "step",
    context: "StepContext",
    other_context: "JobContext",
};

/// Removes every `#[step]` attribute (they are this macro's markers, not
/// real attributes), returning each step fn's options in order.
pub(crate) fn strip_step_attrs(
    item: &mut ItemImpl,
    errors: &mut Errors,
) -> Vec<(usize, StepOptions)> {
    let mut found = Vec::new();
    for (index, impl_item) in item.items.iter_mut().enumerate() {
        let attrs = match impl_item {
            ImplItem::Fn(f) => &mut f.attrs,
            ImplItem::Const(c) => &mut c.attrs,
            ImplItem::Type(t) => &mut t.attrs,
            ImplItem::Macro(m) => &mut m.attrs,
            _ => continue,
        };
        let mut steps = Vec::new();
        attrs.retain(|attr| {
            if is_step_attr(attr) {
                steps.push(attr.clone());
                false
            } else {
                true
            }
        });
        let is_fn = matches!(impl_item, ImplItem::Fn(_));
        for (n, attr) in steps.iter().enumerate() {
            if !is_fn {
                errors.spanned(
                    attr,
                    "`#[step]` goes on an `async fn` of the impl block: a step is a fn",
                );
            } else if n > 0 {
                errors.spanned(
                    attr,
                    "this fn already has a `#[step]` attribute: merge them into one, as in `#[step(start, name = \"...\")]`",
                );
            }
        }
        if is_fn && let Some(attr) = steps.first() {
            let options = parse_step(attr, errors);
            found.push((index, options));
        }
    }
    found
}

/// Checks the impl block and its steps, reporting each mistake. The
/// returned impl block has its `#[step]` attributes removed whatever
/// happens, so it can be emitted beside the errors.
pub(crate) fn validate(
    mut item: ItemImpl,
    options: WorkflowOptions,
    errors: &mut Errors,
) -> (ItemImpl, Option<WorkflowModel>) {
    let marked = strip_step_attrs(&mut item, errors);
    // Markers that failed to parse (`#[step(strat)]`) may have been meant
    // as `start`: no "no start step" on top of them.
    let mut steps_clean = errors.is_empty();
    let marked_fns: Vec<Ident> = marked
        .iter()
        .filter_map(|(index, _)| match &item.items[*index] {
            ImplItem::Fn(func) => Some(func.sig.ident.clone()),
            _ => None,
        })
        .collect();
    if let Some((_, path, _)) = &item.trait_ {
        errors.spanned(
            path,
            "`#[workflow]` goes on an inherent impl block (`impl Order { ... }`), not on a trait impl",
        );
    }
    // `unsafe impl Order`: rustc's parser reports it (E0197, inherent impls
    // cannot be unsafe) before the macro runs; without the `unsafe` the
    // expansion adds nothing to that one error.
    if item.trait_.is_none() {
        item.unsafety = None;
    }
    // A `where` clause without parameters (bounds the concrete type meets)
    // is the user's own: it stays on their impl block.
    let generic = !item.generics.params.is_empty();
    if generic {
        let generics = &item.generics;
        let where_clause = &generics.where_clause;
        errors.spanned(
            quote::quote!(#generics #where_clause),
            "a `#[workflow]` type cannot be generic: the workflow is registered and its steps are stored under one name, so it needs one concrete type; write `impl Order { ... }` for a concrete `Order`",
        );
    }
    let type_ident = match &*item.self_ty {
        Type::Path(TypePath { qself: None, path }) => match path.segments.last() {
            Some(last) if matches!(last.arguments, PathArguments::None) => Some(last.ident.clone()),
            Some(_) if generic => None,
            Some(last) => {
                errors.spanned(
                    &last.arguments,
                    "a `#[workflow]` type cannot take generic arguments: use a concrete type",
                );
                None
            }
            None => None,
        },
        other => {
            errors.spanned(
                other,
                "`#[workflow]` goes on the impl block of a named struct or enum: write `impl Order { ... }`",
            );
            None
        }
    };

    let enum_name = match (&options.step_enum, &type_ident) {
        (Some(ident), _) => ident.to_string(),
        (None, Some(ident)) => format!("{}Step", ident.unraw()),
        (None, None) => "OrderStep".to_string(),
    };
    let output_ok = !options.output_unknown
        && options
            .output
            .as_ref()
            .is_none_or(|output| check_output(output, errors));
    // Every marked fn is a step, refused ones included: the stand-in enum
    // beside the errors then has the variant the user's code names.
    let mut steps = Vec::new();
    for (index, step_options) in marked {
        let ImplItem::Fn(func) = &item.items[index] else {
            continue;
        };
        let before = errors.count();
        let step = validate_step(
            func,
            step_options,
            &enum_name,
            &item.self_ty,
            steps.len(),
            errors,
        );
        steps.push(step);
        steps_clean &= errors.count() == before;
    }
    // The steps' parameters' doc comments went to the variants' fields;
    // rustc refuses them on parameters.
    for impl_item in &mut item.items {
        if let ImplItem::Fn(func) = impl_item
            && marked_fns.contains(&func.sig.ident)
        {
            crate::common::strip_param_attrs(func.sig.inputs.iter_mut());
            crate::common::prepare_emitted(&mut func.attrs, &mut func.sig);
        }
    }

    let Some(type_ident) = type_ident else {
        return (item, None);
    };
    // Stand-in types that would not match the user's code are not written
    // at all: with the macro's errors reported, rustc reports no unresolved
    // names on top.
    if !output_ok || steps.iter().any(|s| s.unknown) {
        return (item, None);
    }
    if item.trait_.is_some() {
        // No stand-in types for a trait impl: nothing refers to them.
        return (item, None);
    }
    if steps.is_empty() && errors.is_empty() {
        errors.spanned(
            &item.self_ty,
            "a `#[workflow]` needs at least one step: mark its async fns with `#[step]`, and the first one with `#[step(start)]`",
        );
    }

    // Stable names and variants must be unique; exactly one start step.
    let mut names: HashMap<String, &StepModel> = HashMap::new();
    let mut variants: HashMap<String, &StepModel> = HashMap::new();
    let mut clashing = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        if let Some(first) = names.insert(step.name.clone(), step) {
            errors.spanned(
                &step.fn_ident,
                format!(
                    "two steps are named `{}`: `{}` and `{}`; a step's name is how runs in flight find it, so give one of them another with `#[step(name = \"...\")]`",
                    step.name, first.fn_ident, step.fn_ident
                ),
            );
        }
        if let Some(first) = variants.insert(step.variant.to_string(), step) {
            errors.spanned(
                &step.fn_ident,
                format!(
                    "steps `{}` and `{}` both become the variant `{}` of the step enum: rename one of the fns",
                    first.fn_ident, step.fn_ident, step.variant
                ),
            );
            clashing.push(index);
        }
    }
    // Aliases, once every name is known: each stored name leads to one step.
    // A refused alias is left out of the expansion beside the error (serde
    // would report it again as an unreachable pattern).
    let mut refused: Vec<(usize, String)> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        for alias in &step.aliases {
            let value = alias.value();
            if value == step.name {
                errors.spanned(
                    alias,
                    format!(
                        "`{value}` is the step's own name: an alias names where runs of an earlier version are parked; remove it"
                    ),
                );
                refused.push((index, value));
            } else if let Some(first) = names.insert(value.clone(), step) {
                errors.spanned(
                    alias,
                    format!(
                        "`{value}` already names step `{}`: a stored step name must lead to one step, so runs parked under it would have two; remove this alias or that name",
                        first.fn_ident
                    ),
                );
                refused.push((index, value));
            }
        }
    }
    for (index, value) in refused {
        steps[index].aliases.retain(|alias| alias.value() != value);
    }
    // The later ones get a variant of their own in the stand-in enum beside
    // the error, so the enum is still one type and the user's
    // `OrderStep::Ship { .. }` means the first.
    for index in clashing {
        let step = &mut steps[index];
        step.variant = format_ident!("__TaqubaClashing{index}", span = step.variant.span());
    }
    let starts: Vec<usize> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.start)
        .map(|(i, _)| i)
        .collect();
    let start = match starts.as_slice() {
        [] => {
            if !steps.is_empty() && steps_clean {
                errors.spanned(
                    &item.self_ty,
                    format!(
                        "`{type_ident}` has no start step: mark the step a run begins with as `#[step(start)]` (for example `{}`)",
                        steps[0].fn_ident
                    ),
                );
            }
            None
        }
        [one] => Some(*one),
        [first, rest @ ..] => {
            for other in rest {
                errors.spanned(
                    &steps[*other].fn_ident,
                    format!(
                        "only one step can be `#[step(start)]`, and `{}` already is: remove `start` from one of them",
                        steps[*first].fn_ident
                    ),
                );
            }
            // The first one, for the stand-in input struct beside the error
            // (so `OrderInput { .. }` in the user's code still resolves).
            Some(*first)
        }
    };

    let name = options
        .name
        .as_ref()
        .map(LitStr::value)
        .unwrap_or_else(|| type_ident.unraw().to_string());
    let step_enum = options
        .step_enum
        .clone()
        .unwrap_or_else(|| format_ident!("{}Step", type_ident.unraw(), span = type_ident.span()));
    let input = options
        .input
        .clone()
        .unwrap_or_else(|| format_ident!("{}Input", type_ident.unraw(), span = type_ident.span()));
    let self_ty = (*item.self_ty).clone();
    let model = WorkflowModel {
        options,
        item: item.clone(),
        self_ty,
        type_ident,
        name,
        step_enum,
        input,
        steps,
        start,
    };
    (item, Some(model))
}

/// Checks one `#[step]` fn, reporting each mistake. The model is returned
/// whatever was reported: beside an error it describes the stand-in
/// variant (the parameters as they were meant).
fn validate_step(
    func: &ImplItemFn,
    options: StepOptions,
    enum_name: &str,
    self_ty: &Type,
    index: usize,
    errors: &mut Errors,
) -> StepModel {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            format!(
                "a `#[step]` must be an `async fn`: write `async fn {}(...)`",
                sig.ident
            ),
        );
    }
    if let Some(constness) = &sig.constness {
        errors.spanned(
            constness,
            "a `#[step]` fn cannot be `const`: remove `const`",
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.spanned(
            unsafety,
            "a `#[step]` fn cannot be `unsafe`: make it safe and use an `unsafe` block inside",
        );
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(
            abi,
            "a `#[step]` fn cannot have an ABI: remove the `extern`",
        );
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(variadic, "a `#[step]` fn cannot be variadic");
    }
    // A generic step's parameters name its type parameters, which the step
    // enum cannot: no stand-in types would match (see `StandIn::Unknown`).
    let concrete = check_generics(
        &sig.generics,
        "a `#[step]` fn",
        "its parameters are stored in the step enum, which needs concrete types; replace each type parameter with the concrete type (lifetimes, as in `StepContext<'a>` or `&'a str`, are fine)",
        errors,
    );
    let (receiver, typed) = typed_inputs(&sig.inputs, None, errors);
    if let Some(receiver) = receiver
        && !shared_self(receiver)
    {
        errors.spanned(
            receiver,
            "a `#[step]` fn takes `&self` or no receiver: the runtime shares the workflow value between concurrent runs",
        );
    }
    let mut fields = Params::default();
    for arg in typed {
        if let Type::Reference(r) = &*arg.ty
            && crate::common::is_named(&r.elem, "Step")
        {
            errors.spanned(
                &arg.ty,
                "take `ctx: StepContext<'_>` instead of `&Step`: it dereferences to the `Step` (and its `Delivery`), and its `memo` is namespaced by step name",
            );
            continue;
        }
        fields.push(arg, &RULES, errors);
    }
    let Params {
        mut params,
        slots,
        unknown,
        ..
    } = fields;
    // `Self` in a parameter's type is the workflow type: the step enum is
    // declared outside the impl block, where it is named as written.
    for param in &mut params {
        param.field_ty = replace_self(&param.field_ty, self_ty);
    }
    let ret = match &sig.output {
        ReturnType::Default => {
            errors.at(
                sig.paren_token.span.close(),
                format!(
                    "a `#[step]` fn returns its transition: write `async fn {}(...) -> Result<Transition<{enum_name}>, StepError>`",
                    sig.ident
                ),
            );
            None
        }
        // `Result<Transition<..>, E>` under any name: the `StepReturn`
        // check of the expansion decides, at this type's span.
        ReturnType::Type(_, ty) => match (first_borrow(ty), first_unnamed(ty)) {
            (Some(lifetime), _) => {
                errors.spanned(
                    &lifetime,
                    "a step's transition and error are stored, so they cannot borrow: return owned types",
                );
                None
            }
            (None, Some(unnamed)) => {
                errors.spanned(
                    unnamed,
                    format!(
                        "a step returns `Result<Transition<{enum_name}>, E>` with named types: write the error type (`StepError`, `anyhow::Error`, your own), not `impl Trait` or `_`"
                    ),
                );
                None
            }
            (None, None) => Some((**ty).clone()),
        },
    };
    let name = options
        .name
        .as_ref()
        .map(LitStr::value)
        .unwrap_or_else(|| sig.ident.unraw().to_string());
    let variant = match derived_ident(&pascal_case(&sig.ident.to_string()), sig.ident.span()) {
        Some(variant) => variant,
        None => {
            errors.spanned(
                &sig.ident,
                format!(
                    "the step enum's variant for a step is its fn's name in PascalCase, and `{}` gives `{}`, which is not an identifier: rename the fn (its stored name can stay `{name}` with `#[step(name = \"{name}\")]`)",
                    sig.ident,
                    pascal_case(&sig.ident.to_string()),
                ),
            );
            // A variant the user's code cannot name, for the stand-in enum.
            format_ident!("__TaqubaStep{}", index, span = sig.ident.span())
        }
    };
    StepModel {
        fn_ident: sig.ident.clone(),
        name,
        aliases: options.aliases.clone(),
        variant,
        receiver: receiver.is_some(),
        params,
        slots,
        // Only read when nothing was reported (see `expand`).
        ret: ret.unwrap_or_else(|| syn::parse_quote!(())),
        start: options.start.is_some(),
        docs: func
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("doc"))
            .cloned()
            .collect(),
        cfgs: func
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("cfg"))
            .cloned()
            .collect(),
        unknown: unknown || !concrete,
    }
}

/// Whether a receiver lends the workflow value: `&self`, `&'a self`,
/// `self: &Self`.
fn shared_self(receiver: &syn::Receiver) -> bool {
    match &*receiver.ty {
        Type::Reference(reference) if reference.mutability.is_none() => matches!(
            &*reference.elem,
            Type::Path(TypePath { qself: None, path }) if path.is_ident("Self")
        ),
        _ => false,
    }
}

/// Reports an `output = ...` type that cannot be a stored output (`impl
/// Trait`, `_`, a borrow); `false` then.
fn check_output(output: &Type, errors: &mut Errors) -> bool {
    if first_borrow(output).is_some() {
        errors.spanned(
            output,
            "a workflow's output is stored and read back by the caller, so it cannot borrow: name an owned type (`String` instead of `&str`)",
        );
        return false;
    }
    match first_unnamed(output) {
        Some(unnamed) => {
            errors.spanned(
                unnamed,
                "`output` takes a concrete type: the output is stored and decoded by the caller as that type; name it (for example `output = Receipt`)",
            );
            false
        }
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use quote::ToTokens;
    use quote::quote;

    use super::*;
    use crate::workflow::parse;

    fn run(
        attr: proc_macro2::TokenStream,
        item: proc_macro2::TokenStream,
    ) -> (Option<WorkflowModel>, Vec<String>) {
        let item: ItemImpl = syn::parse2(item).unwrap();
        let mut errors = Errors::new();
        let options = parse::parse(attr, &mut errors);
        let (stripped, model) = validate(item, options, &mut errors);
        assert!(
            !stripped.to_token_stream().to_string().contains("step ("),
            "the #[step] markers are removed"
        );
        (model, errors.messages())
    }

    #[test]
    fn a_workflow_validates() {
        let (model, messages) = run(
            quote!(name = "order"),
            quote!(impl Order {
                #[step(start)]
                async fn charge(&self, ctx: StepContext<'_>, order_id: &str, cents: u64) -> Result<Transition<OrderStep>, StepError> {}
                #[step(name = "ship_it")]
                async fn ship(order_id: String) -> Result<Transition<OrderStep>, StepError> {}
                fn helper(&self) {}
            }),
        );
        assert!(messages.is_empty(), "{messages:?}");
        let model = model.unwrap();
        assert_eq!(model.name, "order");
        assert_eq!(model.step_enum, "OrderStep");
        assert_eq!(model.input, "OrderInput");
        assert_eq!(model.steps.len(), 2);
        assert_eq!(model.steps[1].name, "ship_it");
        assert_eq!(model.steps[1].variant, "Ship");
        assert!(model.steps[0].receiver && !model.steps[1].receiver);
        assert_eq!(model.start, Some(0));
    }

    #[test]
    fn step_mistakes_accumulate() {
        let (model, messages) = run(
            quote!(),
            quote!(impl Order {
                #[step(start)]
                fn a(&mut self, (x, y): (u8, u8)) -> (u8, u8) {}
                #[step]
                async fn b(step: &Step, v: impl Trait) -> Result<Transition<OrderStep>, StepError> {}
                #[step]
                async fn c(v: Self) {}
            }),
        );
        // A pattern and `impl Trait` have no stand-in: no stand-in types.
        assert!(model.is_none());
        let expected = [
            "must be an `async fn`",
            "takes `&self` or no receiver",
            "destructuring patterns",
            "instead of `&Step`",
            "`impl Trait`",
            "returns its transition",
        ];
        assert_eq!(messages.len(), expected.len(), "{messages:?}");
        for (message, needle) in messages.iter().zip(expected) {
            assert!(message.contains(needle), "{message} / {needle}");
        }
    }

    #[test]
    fn refused_steps_keep_their_stand_in_variant() {
        let (model, messages) = run(
            quote!(),
            quote!(impl Order {
                #[step(start)]
                fn a(&mut self, #[serde(rename = "x")] id: String, n: &mut u32) -> Result<Transition<OrderStep>, StepError> {}
                #[step]
                async fn b(me: Self, ctx: &StepContext<'_>) {}
            }),
        );
        assert_eq!(messages.len(), 5, "{messages:?}");
        let model = model.expect("stand-ins match the code as written");
        assert_eq!(model.start, Some(0), "the refused start step is the input");
        let fields: Vec<Vec<String>> = model
            .steps
            .iter()
            .map(|s| {
                s.params
                    .iter()
                    .map(|p| {
                        let ty = &p.field_ty;
                        format!("{}: {}", p.ident, quote!(#ty))
                    })
                    .collect()
            })
            .collect();
        assert_eq!(
            fields,
            [vec!["id: String", "n: u32"], vec!["me: Order"]],
            "the fields as meant, `Self` as the type"
        );
    }

    #[test]
    fn receivers_that_lend_the_value_are_accepted() {
        let (_, messages) = run(
            quote!(),
            quote!(impl Order {
                #[step(start)]
                async fn a<'a>(&'a self) -> Result<Transition<OrderStep>, StepError> {}
                #[step]
                async fn b(self: &Self) -> Result<Transition<OrderStep>, StepError> {}
                #[step]
                async fn c(self: std::sync::Arc<Self>) -> Result<Transition<OrderStep>, StepError> {}
                #[step]
                async fn d(self) -> Result<Transition<OrderStep>, StepError> {}
            }),
        );
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages.iter().all(|m| m.contains("takes `&self`")));
    }

    #[test]
    fn a_variant_that_is_not_an_identifier_is_reported() {
        let (model, messages) = run(
            quote!(),
            quote!(impl Order {
                #[step(start)]
                async fn _1st() -> Result<Transition<OrderStep>, StepError> {}
            }),
        );
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains("`_1st` gives `1st`"), "{messages:?}");
        assert!(model.is_some());
    }

    #[test]
    fn names_and_start_are_checked() {
        let (_, messages) = run(
            quote!(),
            quote!(impl Order {
                #[step]
                async fn a() -> Result<Transition<OrderStep>, StepError> {}
                #[step(name = "a")]
                async fn b() -> Result<Transition<OrderStep>, StepError> {}
            }),
        );
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains("two steps are named `a`"));
        assert!(messages[1].contains("has no start step"));

        let (_, messages) = run(
            quote!(),
            quote!(impl Order {
                #[step(start)]
                async fn a() -> Result<Transition<OrderStep>, StepError> {}
                #[step(start)]
                async fn b() -> Result<Transition<OrderStep>, StepError> {}
            }),
        );
        assert!(
            messages[0].contains("only one step can be `#[step(start)]`"),
            "{messages:?}"
        );
    }

    #[test]
    fn an_impl_without_steps_is_reported() {
        let (_, messages) = run(quote!(), quote!(impl Order { fn helper() {} }));
        assert!(messages[0].contains("needs at least one step"));
    }

    #[test]
    fn trait_impls_and_generics_are_rejected() {
        let (_, messages) = run(
            quote!(),
            quote!(
                impl<T> Tr for Order<T> {}
            ),
        );
        // One for the trait impl, one for the generics (not another for
        // `Order<T>`'s argument).
        assert_eq!(messages.len(), 2, "{messages:?}");
    }
}
