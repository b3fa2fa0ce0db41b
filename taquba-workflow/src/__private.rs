//! Support of the generated code (placeholder until the macros land).
