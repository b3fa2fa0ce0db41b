//! The options of `#[workflow(...)]` and `#[step(...)]`.

use proc_macro2::TokenStream;
use syn::{Attribute, Ident, LitStr, Meta, Path, Type, Visibility};

use crate::common::{Errors, Misspelt, for_each_option};

/// Every option `#[workflow]` accepts.
pub(crate) const OPTIONS: &[&str] = &[
    "name",
    "output",
    "step_enum",
    "input",
    "vis",
    "derive",
    "crate",
    "version",
    "patches",
];

/// Every option `#[step]` accepts.
pub(crate) const STEP_OPTIONS: &[&str] = &["start", "name", "alias"];

/// `#[workflow(...)]` as written.
#[derive(Default)]
pub(crate) struct WorkflowOptions {
    /// `name = "order"`: the workflow's stable name (default: the type's
    /// name).
    pub(crate) name: Option<LitStr>,
    /// `output = Receipt`: the type a finished run returns (default `()`).
    pub(crate) output: Option<Type>,
    /// `step_enum = OrderStep`.
    pub(crate) step_enum: Option<Ident>,
    /// `input = OrderInput`.
    pub(crate) input: Option<Ident>,
    /// `vis = pub(crate)`: the generated types' visibility.
    pub(crate) vis: Option<Visibility>,
    /// `derive(Debug, Clone)`: extra derives on the generated types.
    pub(crate) derives: Vec<Path>,
    /// `crate = path`.
    pub(crate) krate: Option<Path>,
    /// `version = "2.1.0"`: the code's version, recorded with its runs and
    /// steps (default: the crate's `CARGO_PKG_VERSION`).
    pub(crate) version: Option<LitStr>,
    /// `patches = ["skip-slack-post"]`: the patch ids the code declares.
    pub(crate) patches: Vec<LitStr>,
    /// Whether the output is unknown: none was read, and one may have been
    /// meant (an `output` option, maybe misspelt, whose value could not be
    /// read, or an option that could not be read at all). The stand-in
    /// types beside the errors would then have `()` as the output, which
    /// the user's code may not match: none are written.
    pub(crate) output_unknown: bool,
}

/// Parses `#[workflow(...)]`, reporting every malformed, unknown or
/// duplicate option.
pub(crate) fn parse(attr: TokenStream, errors: &mut Errors) -> WorkflowOptions {
    let mut options = WorkflowOptions::default();
    let mut output_written = false;
    let unread = for_each_option(
        attr,
        "workflow",
        OPTIONS,
        Misspelt::ReadAsMeant,
        errors,
        |name, arg, errors| match name {
            "name" => options.name = arg.name_str("name = \"order\"", errors),
            "output" => {
                output_written = true;
                options.output = arg.parse_value("a type", "output = Receipt", errors);
            }
            "step_enum" => {
                options.step_enum =
                    arg.parse_value("an identifier", "step_enum = OrderStep", errors)
            }
            "input" => {
                options.input = arg.parse_value("an identifier", "input = OrderInput", errors)
            }
            "vis" => options.vis = arg.parse_value("a visibility", "vis = pub(crate)", errors),
            "derive" => options.derives = arg.derives(errors),
            "crate" => options.krate = arg.crate_path(errors),
            "version" => options.version = version(arg, errors),
            "patches" => options.patches = patches(arg, errors),
            _ => {}
        },
    );
    options.output_unknown = options.output.is_none() && (output_written || unread);
    options
}

/// The longest `version`, in bytes: the runtime keeps no more.
const MAX_VERSION_LEN: usize = 256;

/// `version = "2.1.0"`: a non-empty string of at most 256 bytes.
fn version(arg: &crate::common::OptionArg, errors: &mut Errors) -> Option<LitStr> {
    let lit = arg.name_str("version = \"2.1.0\"", errors)?;
    if lit.value().len() > MAX_VERSION_LEN {
        errors.spanned(
            &lit,
            format!(
                "`version` is {} bytes long; the runtime keeps at most {MAX_VERSION_LEN}",
                lit.value().len()
            ),
        );
        return None;
    }
    Some(lit)
}

/// `patches = ["skip-slack-post", ...]`: distinct non-empty string
/// literals.
fn patches(arg: &crate::common::OptionArg, errors: &mut Errors) -> Vec<LitStr> {
    const EXAMPLE: &str = "patches = [\"skip-slack-post\"]";
    let Some(tokens) = arg.value(EXAMPLE, errors) else {
        return Vec::new();
    };
    let Ok(array) = syn::parse2::<syn::ExprArray>(tokens.clone()) else {
        errors.spanned(
            tokens,
            format!("`patches` takes a list of string literals: write `{EXAMPLE}`"),
        );
        return Vec::new();
    };
    let mut patches: Vec<LitStr> = Vec::new();
    for elem in &array.elems {
        let syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            ..
        }) = elem
        else {
            errors.spanned(
                elem,
                format!("a patch id is a string literal: write `{EXAMPLE}`"),
            );
            continue;
        };
        let value = lit.value();
        if value.trim().is_empty() || value.trim() != value || value.chars().any(char::is_control) {
            errors.spanned(
                lit,
                "a patch id cannot be empty, start or end with whitespace, or contain control characters",
            );
            continue;
        }
        if patches.iter().any(|p| p.value() == value) {
            errors.spanned(lit, format!("patch {value:?} is declared twice"));
            continue;
        }
        patches.push(lit.clone());
    }
    patches
}

/// `#[step(...)]` as written.
#[derive(Default)]
pub(crate) struct StepOptions {
    /// `start`: runs begin with this step.
    pub(crate) start: Option<Ident>,
    /// `name = "charge"`: the step's stable name (default: the fn name).
    pub(crate) name: Option<LitStr>,
    /// `alias = "charge"` (any number): names the step was stored under
    /// before, so runs parked under an old name resume here.
    pub(crate) aliases: Vec<LitStr>,
}

/// Whether an attribute is `#[step]` (or a path ending in `step`).
pub(crate) fn is_step_attr(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "step")
}

/// Parses one `#[step]` / `#[step(...)]` attribute.
pub(crate) fn parse_step(attr: &Attribute, errors: &mut Errors) -> StepOptions {
    let mut options = StepOptions::default();
    let tokens = match &attr.meta {
        Meta::Path(_) => return options,
        Meta::List(list) => list.tokens.clone(),
        Meta::NameValue(nv) => {
            errors.spanned(
                nv,
                "write `#[step]`, `#[step(start)]` or `#[step(name = \"...\")]`",
            );
            return options;
        }
    };
    // A step's options do not shape the stand-in types (a misspelt `start`
    // is not guessed, see below).
    let _unread = for_each_option(
        tokens,
        "step",
        STEP_OPTIONS,
        // A misspelt `start` is not taken as one (that could make two):
        // the missing start step is not reported on top of it instead.
        Misspelt::Skip,
        errors,
        |name, arg, errors| match name {
            "start" if arg.flag(errors) => options.start = Some(arg.key.clone()),
            "name" => options.name = step_name(arg, errors),
            "alias" => options.aliases.extend(step_name(arg, errors)),
            _ => {}
        },
    );
    options
}

/// `#[step(name = "...")]`: a name without `/`, which separates the step's
/// name from the key in its memo's namespace (`"{step}/{key}"`): step `a`
/// with key `b/c` and step `a/b` with key `c` would share a memo entry.
fn step_name(arg: &crate::common::OptionArg, errors: &mut Errors) -> Option<LitStr> {
    let example = match arg.key.to_string().as_str() {
        "alias" => "alias = \"charge\"",
        _ => "name = \"charge\"",
    };
    let lit = arg.name_str(example, errors)?;
    if lit.value().contains('/') {
        errors.spanned(
            &lit,
            format!(
                "a step's name cannot contain `/`: it separates the step's name from the key in the step's memo (`\"{{step}}/{{key}}\"`), so a memo of one step could be read by another; write `{} = {:?}`",
                arg.key,
                lit.value().replace('/', "-")
            ),
        );
        return None;
    }
    Some(lit)
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::parse_quote;

    use super::*;

    #[test]
    fn workflow_options_parse() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(name = "order", output = Vec<Receipt>, step_enum = S, input = I, vis = pub(crate), derive(Debug)),
            &mut errors,
        );
        assert!(errors.is_empty(), "{:?}", errors.messages());
        assert_eq!(options.name.map(|n| n.value()).as_deref(), Some("order"));
        assert!(options.output.is_some());
        assert!(matches!(options.vis, Some(Visibility::Restricted(_))));
        assert_eq!(options.derives.len(), 1);
    }

    #[test]
    fn version_and_patches_parse_and_their_mistakes_are_named() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(
                version = "2.1.0",
                patches = ["skip-slack-post", "new-pricing"]
            ),
            &mut errors,
        );
        assert!(errors.is_empty(), "{:?}", errors.messages());
        assert_eq!(options.version.map(|v| v.value()).as_deref(), Some("2.1.0"));
        assert_eq!(options.patches.len(), 2);

        let mut errors = Errors::new();
        parse(
            quote!(version = 2, patches = ["a", "a", 3, ""], version = "x"),
            &mut errors,
        );
        let messages = errors.messages();
        assert_eq!(messages.len(), 5, "{messages:?}");
        assert!(messages[0].contains("`version` takes a string literal"));
        assert!(messages[1].contains("patch \"a\" is declared twice"));
        assert!(messages[2].contains("a patch id is a string literal"));
        assert!(messages[3].contains("cannot be empty"));
        assert!(messages[4].contains("duplicate option `version`"));

        let mut errors = Errors::new();
        parse(quote!(patches = "a"), &mut errors);
        assert!(errors.messages()[0].contains("takes a list of string literals"));
    }

    #[test]
    fn workflow_option_mistakes_accumulate() {
        let mut errors = Errors::new();
        parse(
            quote!(outptu = u8, name = "", name = "x", vis = 3),
            &mut errors,
        );
        let messages = errors.messages();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert!(messages[0].contains("did you mean `output`?"));
        assert!(messages[1].contains("cannot be empty"));
        assert!(messages[2].contains("duplicate option `name`"));
        assert!(messages[3].contains("takes a visibility"));
    }

    #[test]
    fn mistaken_options_are_reported_once_and_read_as_meant() {
        // The stand-in types beside the errors then match the user's code
        // (no `Transition::done(5)` checked against a default output).
        let mut errors = Errors::new();
        let options = parse(
            quote!(outptu = u32, step_enum = "Steps", input = "Start"),
            &mut errors,
        );
        let messages = errors.messages();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].contains("did you mean `output`?"));
        assert!(
            messages[1].contains(
                "`step_enum` takes an identifier, not a string: write `step_enum = Steps`"
            )
        );
        assert!(messages[2].contains("write `input = Start`"));
        assert!(options.output.is_some());
        assert_eq!(
            options.step_enum.map(|i| i.to_string()).as_deref(),
            Some("Steps")
        );
        assert_eq!(
            options.input.map(|i| i.to_string()).as_deref(),
            Some("Start")
        );

        // A misspelt option whose value is wrong too: one error, the typo.
        let mut errors = Errors::new();
        let options = parse(quote!(outptu = 3), &mut errors);
        assert_eq!(errors.messages().len(), 1, "{:?}", errors.messages());
        assert!(options.output.is_none());

        // The right option set too: it wins, and nothing more is reported.
        let mut errors = Errors::new();
        let options = parse(quote!(outptu = u8, output = u32), &mut errors);
        assert_eq!(errors.messages().len(), 1, "{:?}", errors.messages());
        assert_eq!(
            options.output.map(|t| quote!(#t).to_string()).as_deref(),
            Some("u32")
        );
    }

    #[test]
    fn an_output_meant_but_not_read_is_unknown() {
        // No stand-in types then: their `()` output may not match the
        // user's `Transition::done(..)`.
        for attr in [
            quote!(outptu = 3),
            quote!(outptu(u32)),
            quote!(output(u32)),
            quote!(output),
            quote!(outptu: u32),
            quote!(result = u32),
        ] {
            let mut errors = Errors::new();
            let options = parse(attr.clone(), &mut errors);
            assert_eq!(
                errors.messages().len(),
                1,
                "{attr}: {:?}",
                errors.messages()
            );
            assert!(options.output.is_none() && options.output_unknown, "{attr}");
        }
        // Read, read as meant, or not meant at all: known.
        for attr in [
            quote!(output = u32),
            quote!(outptu = u32),
            quote!(name = 5),
            quote!(nmae = "x"),
            quote!(),
        ] {
            let mut errors = Errors::new();
            let options = parse(attr.clone(), &mut errors);
            assert!(!options.output_unknown, "{attr}: {:?}", errors.messages());
        }
    }

    #[test]
    fn step_options_parse() {
        let mut errors = Errors::new();
        let attr: Attribute = parse_quote!(#[step(start, name = "charge")]);
        assert!(is_step_attr(&attr));
        let options = parse_step(&attr, &mut errors);
        assert!(errors.is_empty());
        assert!(options.start.is_some());
        assert_eq!(options.name.map(|n| n.value()).as_deref(), Some("charge"));

        let attr: Attribute = parse_quote!(#[step(name = "charge/v2")]);
        let options = parse_step(&attr, &mut errors);
        assert!(options.name.is_none());
        assert!(
            errors.messages()[0].contains("cannot contain `/`"),
            "{:?}",
            errors.messages()
        );

        let mut errors = Errors::new();
        let attr: Attribute = parse_quote!(#[step(begin)]);
        parse_step(&attr, &mut errors);
        assert!(errors.messages()[0].contains("unknown `#[step]` option `begin`"));
    }
}
