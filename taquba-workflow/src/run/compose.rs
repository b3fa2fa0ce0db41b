//! Composing settlement effects: several parts of the runtime add to one
//! transaction (a settlement and its history entry, a command's effect and
//! its record).

use taquba::SettlementEffects;

/// Whether `effects` changes nothing.
pub(crate) fn is_empty(effects: &SettlementEffects) -> bool {
    effects.enqueues.is_empty()
        && effects.kv_writes.is_empty()
        && effects.kv_deletes.is_empty()
        && effects.expiry_entries.is_empty()
}

/// Add `more` to `effects`.
pub(crate) fn merge_effects(effects: &mut SettlementEffects, more: SettlementEffects) {
    effects.enqueues.extend(more.enqueues);
    effects.kv_writes.extend(more.kv_writes);
    effects.kv_deletes.extend(more.kv_deletes);
    effects.expiry_entries.extend(more.expiry_entries);
}
