//! Static ownership: the shards a process opens come from its
//! configuration. Kubernetes restarts a dead pod, and SlateDB's writer
//! fencing stops the older of two processes that both open a shard.

use std::collections::BTreeSet;

use super::ClusterError;

/// The shards this process owns, fixed by configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaticOwnership {
    /// Replica `ordinal` of `replicas` (a StatefulSet pod's ordinal) owns
    /// every shard `k` with `k % replicas == ordinal`, so the replicas
    /// together own each shard exactly once.
    Ordinal {
        /// This replica's ordinal, `0..replicas`.
        ordinal: u32,
        /// How many replicas share the cluster.
        replicas: u32,
    },
    /// Exactly these shards (each below the cluster's shard count: a
    /// process is refused at launch otherwise).
    Shards(BTreeSet<u32>),
}

impl StaticOwnership {
    /// Replica `ordinal` of `replicas`.
    ///
    /// # Errors
    /// [`ClusterError::InvalidOwnership`] for no replicas or an ordinal
    /// that is not below the replica count.
    pub fn ordinal(ordinal: u32, replicas: u32) -> Result<Self, ClusterError> {
        if replicas == 0 || ordinal >= replicas {
            return Err(ClusterError::InvalidOwnership(format!(
                "ordinal {ordinal} of {replicas} replicas (the ordinal must be below the replica count)"
            )));
        }
        Ok(Self::Ordinal { ordinal, replicas })
    }

    /// The replica whose host name is `hostname` (a StatefulSet pod's:
    /// `{name}-{ordinal}`, as `HOSTNAME` holds it) of `replicas`.
    ///
    /// # Errors
    /// [`ClusterError::InvalidOwnership`] for a host name that does not end
    /// in `-{ordinal}`, and as [`ordinal`](Self::ordinal).
    pub fn from_hostname(hostname: &str, replicas: u32) -> Result<Self, ClusterError> {
        let ordinal = hostname
            .rsplit_once('-')
            .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|(_, n)| n.parse::<u32>().ok())
            .ok_or_else(|| {
                ClusterError::InvalidOwnership(format!(
                    "host name {hostname:?} does not end in `-<ordinal>` (a StatefulSet pod's name does)"
                ))
            })?;
        Self::ordinal(ordinal, replicas)
    }

    /// Whether this process owns `shard`.
    pub fn owns(&self, shard: u32) -> bool {
        match self {
            Self::Ordinal { ordinal, replicas } => shard % replicas == *ordinal,
            Self::Shards(shards) => shards.contains(&shard),
        }
    }

    /// The shards of a cluster of `shards` this process owns, in order.
    pub fn owned(&self, shards: u32) -> Vec<u32> {
        (0..shards).filter(|&shard| self.owns(shard)).collect()
    }

    /// Refuse an ownership that names a shard a cluster of `shards` does
    /// not have, or owns none of its shards (an ordinal at or past the
    /// shard count: a StatefulSet of more replicas than shards): such a
    /// process would host nothing, silently.
    ///
    /// # Errors
    /// [`ClusterError::NoSuchShard`] for a listed shard past the count;
    /// [`ClusterError::InvalidOwnership`] for an ownership of no shard.
    pub fn check_against(&self, shards: u32) -> Result<(), ClusterError> {
        if let Self::Shards(listed) = self
            && let Some(&shard) = listed.iter().find(|&&shard| shard >= shards)
        {
            return Err(ClusterError::NoSuchShard { shard, shards });
        }
        if self.owned(shards).is_empty() {
            return Err(ClusterError::InvalidOwnership(match self {
                Self::Ordinal { ordinal, replicas } => format!(
                    "ordinal {ordinal} of {replicas} replicas owns no shard of a cluster of {shards} shards: replicas must be at most the shard count"
                ),
                Self::Shards(_) => {
                    "an empty list of shards owns nothing (a process that hosts no shard is a client: Ownership::Client)".to_string()
                }
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_partition_the_shards() {
        let replicas = 3;
        let mut seen = vec![0; 8];
        for ordinal in 0..replicas {
            let owner = StaticOwnership::ordinal(ordinal, replicas).expect("valid");
            for shard in owner.owned(8) {
                seen[shard as usize] += 1;
            }
        }
        assert_eq!(seen, vec![1; 8], "each shard owned exactly once");
        assert_eq!(
            StaticOwnership::ordinal(1, 3).expect("valid").owned(8),
            vec![1, 4, 7]
        );
    }

    #[test]
    fn host_names_give_the_ordinal() {
        assert_eq!(
            StaticOwnership::from_hostname("workers-2", 4).expect("valid"),
            StaticOwnership::Ordinal {
                ordinal: 2,
                replicas: 4
            }
        );
        assert_eq!(
            StaticOwnership::from_hostname("my-app-workers-0", 1)
                .expect("valid")
                .owned(3),
            vec![0, 1, 2]
        );
        for bad in ["workers", "workers-x", "", "workers-+1", "workers-"] {
            let err = StaticOwnership::from_hostname(bad, 2).expect_err("refused");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        let err = StaticOwnership::from_hostname("workers-5", 3).expect_err("past the count");
        assert!(err.to_string().contains("ordinal 5 of 3"), "{err}");
        assert!(StaticOwnership::ordinal(0, 0).is_err());
    }

    #[test]
    fn an_explicit_list_owns_exactly_its_shards() {
        let owner = StaticOwnership::Shards([0, 5, 40].into());
        assert_eq!(owner.owned(8), vec![0, 5]);
        assert!(owner.owns(40) && !owner.owns(1));
    }

    #[test]
    fn an_ownership_of_no_shard_or_past_the_count_is_refused() {
        let past = StaticOwnership::Shards([0, 5, 40].into()).check_against(8);
        assert!(
            matches!(
                past,
                Err(ClusterError::NoSuchShard {
                    shard: 40,
                    shards: 8
                })
            ),
            "{past:?}"
        );
        assert!(
            StaticOwnership::Shards([0, 7].into())
                .check_against(8)
                .is_ok()
        );
        let empty = StaticOwnership::Shards(BTreeSet::new()).check_against(8);
        assert!(
            matches!(empty, Err(ClusterError::InvalidOwnership(_))),
            "{empty:?}"
        );
        let idle = StaticOwnership::ordinal(9, 10)
            .expect("valid")
            .check_against(8);
        match idle {
            Err(ClusterError::InvalidOwnership(message)) => {
                assert!(message.contains("ordinal 9 of 10"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert!(
            StaticOwnership::ordinal(7, 10)
                .expect("valid")
                .check_against(8)
                .is_ok()
        );
    }
}
