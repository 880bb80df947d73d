//! Durability of changes: the group commit of metadata (`commit`) and the sticky record of
//! failed syncs (`failures`).

pub mod commit;
pub mod failures;
