//! Routing: the one function that says which shard holds a run.

use std::num::NonZeroU32;

use sha2::{Digest, Sha256};

/// The name of the routing hash a cluster record stores
/// ([`shard_of`]'s): the first 8 bytes of the SHA-256 of the id, as a
/// big-endian `u64`, modulo the shard count.
pub const HASH_NAME: &str = "sha256-be64-mod";

/// The shard (`0..shards`) that holds the run `run_id`: the first 8 bytes
/// of the SHA-256 of the id's bytes, read as a big-endian `u64`, modulo
/// `shards` ([`HASH_NAME`]). The same in every process, build and tool; a
/// group's members route by the group id instead (see
/// [`ClusterRecord::shard_of_group`](super::ClusterRecord::shard_of_group)).
pub fn shard_of(run_id: &str, shards: NonZeroU32) -> u32 {
    let digest = Sha256::digest(run_id.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let shard = u64::from_be_bytes(head) % u64::from(shards.get());
    // Below `shards`, a u32.
    u32::try_from(shard).unwrap_or(0)
}

/// The prefix of shard `shard` of the cluster at `root`: `{root}/shards/{k}`
/// (`shards/{k}` for an empty root). The shard's queue and memo prefix are
/// under it, as a single store's are under its own root.
pub fn shard_prefix(root: &str, shard: u32) -> String {
    let root = root.trim_matches('/');
    if root.is_empty() {
        format!("shards/{shard}")
    } else {
        format!("{root}/shards/{shard}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(shards: u32) -> NonZeroU32 {
        NonZeroU32::new(shards).expect("non-zero")
    }

    #[test]
    fn the_hash_is_the_documented_one() {
        // The first 8 bytes of the digest as a big-endian u64, modulo the
        // count, computed here independently of `shard_of`.
        let digest = Sha256::digest(b"order-7");
        let head = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
        for shards in [1, 2, 8, 64, 1024] {
            assert_eq!(
                u64::from(shard_of("order-7", n(shards))),
                head % u64::from(shards)
            );
        }
        assert_eq!(shard_of("anything", n(1)), 0);
    }

    #[test]
    fn runs_spread_over_the_shards() {
        let shards = n(8);
        let mut counts = [0u32; 8];
        for i in 0..8_000 {
            let shard = shard_of(&format!("run-{i}"), shards);
            counts[shard as usize] += 1;
        }
        for count in counts {
            assert!((800..1200).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn shard_prefixes_nest_under_the_root() {
        assert_eq!(shard_prefix("prod/wf", 3), "prod/wf/shards/3");
        assert_eq!(shard_prefix("/prod/wf/", 0), "prod/wf/shards/0");
        assert_eq!(shard_prefix("", 7), "shards/7");
    }
}
