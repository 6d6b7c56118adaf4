//! The pipeline's shape, declared once: which stages there are, which edge
//! each reads and writes, and each edge's capacity and full-queue policy.
//!
//! A [`Topology`] is a description: the code that builds a pipeline makes
//! its edges from it ([`Topology::channel`]) and whoever reads a run's
//! figures (a report, a timeline, a CSV) walks it instead of naming stages
//! and edges by string literals that would have to agree. Stages and edges
//! are named by [`StageId`] and [`EdgeId`], declared as constants next to
//! what they name.
//!
//! ```
//! use voxline_core::{EdgeId, FullPolicy, StageId, Topology, Transcript};
//!
//! const WORDS: EdgeId = EdgeId::new("words");
//! const SHOUT: StageId = StageId::new("shout");
//! let topology = Topology::new()
//!     .edge(WORDS, 8, FullPolicy::Block)
//!     .stage(SHOUT, WORDS, None);
//! assert_eq!(topology.input_of("shout"), Some(&WORDS));
//! let (_tx, rx) = topology.channel::<Transcript>(&WORDS).unwrap();
//! assert_eq!(rx.stats().capacity(), 8);
//! ```

use std::borrow::Cow;
use std::fmt;

use crate::edge::{try_edge, EdgeError, EdgeReceiver, EdgeSender, FullPolicy};
use crate::message::Message;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Cow<'static, str>);

        impl $name {
            /// The identity named `name` (a constant).
            #[must_use]
            pub const fn new(name: &'static str) -> Self {
                Self(Cow::Borrowed(name))
            }

            /// An identity made at run time (e.g. for an added stage's output edge).
            #[must_use]
            pub fn owned(name: String) -> Self {
                Self(Cow::Owned(name))
            }

            /// Its name, as spans, edge counters and reports carry it.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == other.as_str()
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                self.as_str() == other.0
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    };
}

id_type!(
    /// A stage's identity (its name in spans and reports).
    StageId
);
id_type!(
    /// An edge's identity (its name in edge counters and reports).
    EdgeId
);

/// One edge of a [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeSpec {
    /// Which edge.
    pub id: EdgeId,
    /// Items it holds.
    pub capacity: usize,
    /// What a send does when it is full.
    pub policy: FullPolicy,
}

/// One stage of a [`Topology`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSpec {
    /// Which stage.
    pub id: StageId,
    /// The edge it reads.
    pub input: EdgeId,
    /// The edge it writes (`None`: a sink).
    pub output: Option<EdgeId>,
}

impl StageSpec {
    /// Whether the stage only consumes (writes no edge).
    #[must_use]
    pub fn is_sink(&self) -> bool {
        self.output.is_none()
    }
}

/// The stages and edges of a pipeline, stages in flow order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    stages: Vec<StageSpec>,
    edges: Vec<EdgeSpec>,
}

/// A [`Topology`] was asked for an edge it does not declare, or one it
/// cannot make.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// No such edge.
    #[error("the topology declares no edge `{0}`")]
    UnknownEdge(EdgeId),
    /// No such stage, or one that writes no edge.
    #[error("the topology declares no stage `{0}` that writes an edge")]
    NoOutput(String),
    /// The edge's declaration cannot be made into a channel.
    #[error(transparent)]
    Edge(#[from] EdgeError),
}

impl Topology {
    /// An empty topology.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares edge `id` (replacing an earlier declaration of it).
    #[must_use]
    pub fn edge(mut self, id: EdgeId, capacity: usize, policy: FullPolicy) -> Self {
        self.edges.retain(|e| e.id != id);
        self.edges.push(EdgeSpec {
            id,
            capacity,
            policy,
        });
        self
    }

    /// Declares stage `id` reading `input` and writing `output`, after the
    /// stages declared so far.
    #[must_use]
    pub fn stage(mut self, id: StageId, input: EdgeId, output: Option<EdgeId>) -> Self {
        self.stages.push(StageSpec { id, input, output });
        self
    }

    /// Inserts stage `id` right after stage `after`, on the edge `after`
    /// writes: `after` now writes `output` instead, which `id` reads, and
    /// `id` writes what `after` wrote. Declare `output` with
    /// [`Topology::edge`]. A no-op when `after` is not declared or is a sink.
    #[must_use]
    pub fn insert_after(mut self, after: &StageId, id: StageId, output: EdgeId) -> Self {
        let Some(i) = self.stages.iter().position(|s| &s.id == after) else {
            return self;
        };
        let Some(old) = self.stages[i].output.replace(output.clone()) else {
            return self;
        };
        self.stages.insert(
            i + 1,
            StageSpec {
                id,
                input: output,
                output: Some(old),
            },
        );
        self
    }

    /// The stages, in flow order.
    #[must_use]
    pub fn stages(&self) -> &[StageSpec] {
        &self.stages
    }

    /// The edges, in declaration order.
    #[must_use]
    pub fn edges(&self) -> &[EdgeSpec] {
        &self.edges
    }

    /// Stage `name`'s declaration.
    #[must_use]
    pub fn stage_spec(&self, name: &str) -> Option<&StageSpec> {
        self.stages.iter().find(|s| s.id == name)
    }

    /// Edge `id`'s declaration.
    #[must_use]
    pub fn edge_spec(&self, id: &EdgeId) -> Option<&EdgeSpec> {
        self.edges.iter().find(|e| &e.id == id)
    }

    /// The edge stage `name` reads.
    #[must_use]
    pub fn input_of(&self, name: &str) -> Option<&EdgeId> {
        self.stage_spec(name).map(|s| &s.input)
    }

    /// The edge stage `name` writes.
    #[must_use]
    pub fn output_of(&self, name: &str) -> Option<&EdgeId> {
        self.stage_spec(name).and_then(|s| s.output.as_ref())
    }

    /// Whether stage `name` is declared and is a sink.
    #[must_use]
    pub fn is_sink(&self, name: &str) -> bool {
        self.stage_spec(name).is_some_and(StageSpec::is_sink)
    }

    /// Makes edge `id` as declared (its capacity and policy).
    ///
    /// # Errors
    /// [`TopologyError::UnknownEdge`] when it is not declared,
    /// [`TopologyError::Edge`] when its capacity is zero.
    pub fn channel<T: Message>(
        &self,
        id: &EdgeId,
    ) -> Result<(EdgeSender<T>, EdgeReceiver<T>), TopologyError> {
        let spec = self
            .edge_spec(id)
            .ok_or_else(|| TopologyError::UnknownEdge(id.clone()))?;
        Ok(try_edge(id.as_str(), spec.capacity, spec.policy)?)
    }

    /// Makes the edge stage `name` writes, as declared.
    ///
    /// # Errors
    /// [`TopologyError::NoOutput`] when no such stage writes an edge, else
    /// as [`Topology::channel`].
    pub fn channel_from<T: Message>(
        &self,
        name: &str,
    ) -> Result<(EdgeSender<T>, EdgeReceiver<T>), TopologyError> {
        let id = self
            .output_of(name)
            .ok_or_else(|| TopologyError::NoOutput(name.to_owned()))?;
        self.channel(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Transcript;

    const A: EdgeId = EdgeId::new("a");
    const B: EdgeId = EdgeId::new("b");
    const ONE: StageId = StageId::new("one");
    const END: StageId = StageId::new("end");

    fn line() -> Topology {
        Topology::new()
            .edge(A, 4, FullPolicy::Block)
            .edge(B, 2, FullPolicy::DropOldest)
            .stage(ONE, A, Some(B))
            .stage(END, B, None)
    }

    #[test]
    fn stages_know_their_edges() {
        let t = line();
        assert_eq!(t.input_of("one"), Some(&A));
        assert_eq!(t.output_of("one"), Some(&B));
        assert!(t.is_sink("end"));
        assert!(!t.is_sink("one"));
        assert!(!t.is_sink("nobody"));
        assert_eq!(
            t.edge_spec(&B).map(|e| e.policy),
            Some(FullPolicy::DropOldest)
        );
    }

    #[test]
    fn a_stage_inserted_after_another_takes_over_its_output() {
        const MID: StageId = StageId::new("mid");
        let mid_out = EdgeId::owned("mid_in".into());
        let t = line()
            .edge(mid_out.clone(), 3, FullPolicy::Block)
            .insert_after(&ONE, MID, mid_out.clone());
        let names: Vec<&str> = t.stages().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["one", "mid", "end"]);
        assert_eq!(t.output_of("one"), Some(&mid_out));
        assert_eq!(t.input_of("mid"), Some(&mid_out));
        assert_eq!(t.output_of("mid"), Some(&B));
        assert_eq!(t.input_of("end"), Some(&B));
    }

    #[test]
    fn channels_are_made_as_declared() {
        let t = line();
        let (tx, rx) = t.channel::<Transcript>(&B).unwrap();
        let (_, from_one) = t.channel_from::<Transcript>("one").unwrap();
        assert_eq!(from_one.stats().name(), "b");
        assert!(matches!(
            t.channel_from::<Transcript>("end"),
            Err(TopologyError::NoOutput(_))
        ));
        assert_eq!(rx.stats().capacity(), 2);
        assert_eq!(tx.stats().name(), "b");
        assert!(matches!(
            t.channel::<Transcript>(&EdgeId::new("c")),
            Err(TopologyError::UnknownEdge(_))
        ));
        let zero = Topology::new().edge(A, 0, FullPolicy::Block);
        assert!(matches!(
            zero.channel::<Transcript>(&A),
            Err(TopologyError::Edge(_))
        ));
    }

    #[test]
    fn ids_compare_with_the_names_runs_carry() {
        assert_eq!(ONE, "one");
        assert_eq!(String::from("one"), ONE);
        assert_eq!(ONE.to_string(), "one");
        assert_ne!(END, *"one");
    }
}
