//! A change sent to a store's owner and its answer as the command line
//! prints it: [`Change`] (the inbox command and what it does in words),
//! [`command_card`] (a command's state as a card; its JSON is
//! [`CommandJson`]) and [`answer`], which prints the final state and turns
//! a rejection into the exit code. Shared by the inbox path
//! ([`crate::commands::mutate`]) and the offline path
//! ([`crate::commands::offline`]).

use taquba_workflow::{inbox::Command, inbox::CommandId, inbox::CommandState};

use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Times};
use crate::present::command::CommandJson;

/// A change to send, with what it is in words.
pub struct Change {
    /// The inbox command.
    pub command: Command,
    /// What it does, for messages: `cancel run X`.
    pub what: String,
}

/// `json` as a card, with a note on what a state that is not final means.
pub fn command_card(json: &CommandJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Command", &json.command_id)
        .field("State", json.state.as_str());
    if let Some(answer) = &json.answer {
        card.field("Answer", answer.text());
    }
    card.field_opt("Error", json.error.as_deref());
    if let Some(at) = json.at_ms {
        card.field("Recorded", times.at(at));
    }
    card.field("Object", &json.path);
    card.field_opt("Note", json.state.note());
    card
}

/// Print the final state of command `id`; a rejection, or an answer that
/// says nothing was done, is an error (exit code 1) after printing.
pub fn answer(id: &CommandId, state: &CommandState, path: String, out: &Output) -> CliResult<()> {
    let json = CommandJson::new(id, state, path);
    out.one(&json, |times| command_card(&json, times))?;
    if let Some(error) = &json.error {
        return Err(CliError::Refused(format!(
            "the owner rejected command {id}: {error}"
        )));
    }
    if let Some(answer) = &json.answer
        && answer.did_nothing()
    {
        return Err(CliError::Refused(answer.text()));
    }
    Ok(())
}
