//! Why a commit conflicts: the typed reason a retryable
//! [`FormatError::Conflict`](crate::format::FormatError::Conflict) carries. The rules that
//! produce it are in [`super::conflict`]; this file holds only the vocabulary, so the error
//! type can name it without depending on the rules.

use crate::ledger::ids::FragmentId;

/// Why a transaction cannot be applied onto the latest version. The statement must re-read
/// the table and try again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// A fragment this transaction deletes rows of, or rewrites columns of, is gone (a winner
    /// rewrote or removed it).
    #[error("fragment {fragment} was removed by a concurrent commit")]
    FragmentRemoved {
        /// The id of the fragment the transaction touches; the latest version has no such
        /// fragment.
        fragment: FragmentId,
    },
    /// A fragment this transaction touches is not in the version it read.
    #[error("fragment {fragment} is not in the version the statement read")]
    FragmentNotRead {
        /// The id of the fragment the transaction touches, which the version it read does not
        /// have.
        fragment: FragmentId,
    },
    /// A fragment this transaction touches holds other data files than when it was read (a
    /// winner rewrote columns of it in place).
    #[error("fragment {fragment} was rewritten by a concurrent commit")]
    FragmentRewritten {
        /// The id of the fragment the transaction touches; it is still in the table, with
        /// other data files.
        fragment: FragmentId,
    },
    /// A winner deleted (or updated away) `rows` of the rows this transaction deletes or
    /// rewrites in place.
    #[error("{rows} rows of fragment {fragment} were deleted or updated concurrently")]
    RowsDeletedByWinner {
        /// The fragment's id, the same in the read and the latest version.
        fragment: FragmentId,
        /// Rows both the winners and this transaction delete or rewrite (at least one).
        rows: u64,
    },
    /// A segment a rebased index change replaces was replaced (merged, retrained, dropped)
    /// by a winner.
    #[error("segment {segment} of index '{index}' was replaced by a concurrent commit")]
    SegmentReplaced {
        /// The index's name.
        index: String,
        /// The id of the segment the change would remove, absent from the latest version.
        segment: u64,
    },
    /// A fragment the new segments of a rebased index change hold left the table (a winner
    /// rewrote it): keeping the segment would let it own rows another segment owns, or rows
    /// changed since it read them.
    #[error("fragment {fragment} was rewritten or removed while index '{index}' was being built")]
    FragmentLeftDuringBuild {
        /// The index's name.
        index: String,
        /// The id of the fragment a new segment owns (from its fragment bitmap) that the
        /// latest version no longer has.
        fragment: FragmentId,
    },
    /// A source of a rewrite is gone (a winner rewrote or removed it).
    #[error("fragment {fragment} was rewritten or removed by a concurrent commit")]
    RewriteSourceRemoved {
        /// The source fragment's id; the latest version has no such fragment.
        fragment: FragmentId,
    },
    /// A source of a rewrite holds other data files than when the rewrite read it.
    #[error("fragment {fragment} was rewritten in place by a concurrent commit")]
    RewriteSourceRewritten {
        /// The source fragment's id; it is still in the table, with other data files.
        fragment: FragmentId,
    },
    /// A rebased index change names an index a winner dropped.
    #[error("index '{index}' was dropped by a concurrent commit")]
    IndexDropped {
        /// The dropped index's name.
        index: String,
    },
    /// A rebased append to, merge of or retrain of an index whose definition a winner
    /// replaced (retrained it, split partitions, or dropped and created it again): segments
    /// built with the old centroids must not join an index that has new ones.
    #[error("index '{index}' was retrained or redefined by a concurrent commit")]
    IndexRedefined {
        /// The redefined index's name.
        index: String,
    },
    /// A MERGE read every target row to decide what to insert; a concurrent MERGE appended
    /// rows (committed as `version`) that this one may have had to match.
    #[error("a concurrent MERGE (version {version}) added rows this MERGE may have matched")]
    ConcurrentMerge {
        /// The version the concurrent MERGE committed.
        version: u64,
    },
    /// A rebased index creation collides with a winner's index of the same name.
    #[error("index '{index}' was created by a concurrent commit too")]
    IndexCreatedTwice {
        /// The name both commits gave their index.
        index: String,
    },
    /// After the rebase, two segments of one index would own one fragment (e.g. two
    /// concurrent appends indexed the same fragments).
    #[error(
        "fragment {fragment} would be owned by two segments of index '{index}' \
         (segments {first} and {second})",
        first = .segments[0],
        second = .segments[1]
    )]
    FragmentOwnedTwice {
        /// The index's name.
        index: String,
        /// The id of the fragment both segments would own, in the rebased manifest.
        fragment: FragmentId,
        /// The two segments' ids: the one found owning it first, then the other.
        segments: [u64; 2],
    },
    /// A rebased index change would produce a manifest that fails validation for another
    /// reason (the validator's own words).
    #[error("the rebased commit would produce an invalid manifest: {reason}")]
    InvalidAfterRebase {
        /// Why the rebased manifest fails validation, in the validator's words.
        reason: String,
    },
    /// The commit lost the race to publish the next version this many times in a row.
    #[error("too many concurrent commits ({attempts} lost races)")]
    TooManyConcurrentCommits {
        /// Races lost in a row before the commit gave up (the commit loop's limit).
        attempts: usize,
    },
}
