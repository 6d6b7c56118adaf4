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
//!
//! Each stage also declares which part of a turn's response latency it owns
//! ([`Latency`]): the endpointer owns the time from the end of speech to the
//! utterance; every stage after it owns the wait on its input edge and its
//! service time (input taken → output sent); the stage whose first output is
//! the response owns the time to that output. [`Topology::latency_terms`]
//! lists the terms in critical-path order; they add up to the response
//! latency exactly, and the report's decomposition, its bottleneck, the
//! virtual-clock simulator, the budget's keys and the CSV all iterate over
//! them, so a stage added to the topology has its terms in all of them.
//!
//! ```
//! use voxline_core::{EdgeId, FullPolicy, Latency, StageId, Topology};
//!
//! let (audio, text, words) = (EdgeId::new("audio"), EdgeId::new("text"), EdgeId::new("words"));
//! let t = Topology::new()
//!     .edge(audio.clone(), 8, FullPolicy::Block)
//!     .edge(text.clone(), 2, FullPolicy::Block)
//!     .edge(words.clone(), 2, FullPolicy::Block)
//!     .stage(StageId::new("vad"), audio, Some(text.clone()))
//!     .stage(StageId::new("llm"), text, Some(words.clone()))
//!     .stage(StageId::new("sink"), words, None)
//!     .latency(&StageId::new("vad"), Latency::Endpoint)
//!     .latency(&StageId::new("llm"), Latency::FirstOutput("token"));
//! let names: Vec<String> = t.latency_terms().iter().map(|t| t.name.clone()).collect();
//! assert_eq!(names, ["endpoint", "llm_queue", "llm_first_token", "commit_wait"]);
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

/// Which part of a turn's response latency (end of speech → the response's
/// first output) a stage owns; see the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// None: the stage is off the response's critical path (a sink, or a
    /// stage that only watches).
    Off,
    /// The endpointer: the end of speech → the utterance sent downstream
    /// (for a speculative attempt, the attempt sent).
    Endpoint,
    /// The wait on its input edge, then its service: input taken → its
    /// first output sent on.
    Service,
    /// The wait on its input edge, then the time to its first output, which
    /// is the response (named: `"token"` gives the term `<stage>_first_token`).
    FirstOutput(&'static str),
}

/// The part of a turn's latency one [`LatencyTerm`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermPart {
    /// The end of speech → the utterance sent (the [`Latency::Endpoint`] stage).
    Endpoint,
    /// The stage's input waiting on its edge: the previous stage's output
    /// sent → this stage took it.
    Queue,
    /// Input taken → the stage's first output sent.
    Service,
    /// Input taken → the response's first output.
    FirstOutput,
    /// A speculative turn's first output, ready before the commit, held by
    /// the runtime's commit gate until it (the runtime's term, after the
    /// last stage's; 0 for a turn that was not speculative).
    CommitWait,
}

/// One term of a turn's response latency, as [`Topology::latency_terms`]
/// lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyTerm {
    /// Its name in reports, budgets and CSV columns: `endpoint`,
    /// `<stage>_queue`, `<stage>` (service), `<stage>_first_<output>`,
    /// `commit_wait`.
    pub name: String,
    /// The stage that owns it (for [`TermPart::CommitWait`], the stage whose
    /// output the commit gate held).
    pub stage: StageId,
    /// What it measures.
    pub part: TermPart,
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
    /// The part of a turn's latency it owns (declared with
    /// [`Topology::latency`]; by default [`Latency::Service`], or
    /// [`Latency::Off`] for a sink).
    pub latency: Latency,
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
        let latency = if output.is_some() {
            Latency::Service
        } else {
            Latency::Off
        };
        self.stages.push(StageSpec {
            id,
            input,
            output,
            latency,
        });
        self
    }

    /// Declares the part of a turn's latency stage `id` owns (a no-op when
    /// it is not declared).
    #[must_use]
    pub fn latency(mut self, id: &StageId, latency: Latency) -> Self {
        if let Some(s) = self.stages.iter_mut().find(|s| &s.id == id) {
            s.latency = latency;
        }
        self
    }

    /// The terms of a turn's response latency, in critical-path order: the
    /// endpoint, then each stage's queue and service up to the stage whose
    /// first output is the response, then the commit wait. Stages before
    /// the endpointer or after that one, and those declared
    /// [`Latency::Off`], own none. Empty when no stage declares
    /// [`Latency::Endpoint`] followed by one that declares
    /// [`Latency::FirstOutput`] (the response latency is then not defined).
    #[must_use]
    pub fn latency_terms(&self) -> Vec<LatencyTerm> {
        let mut terms = Vec::new();
        let term = |name: String, stage: &StageId, part| LatencyTerm {
            name,
            stage: stage.clone(),
            part,
        };
        for s in &self.stages {
            let id = &s.id;
            match s.latency {
                Latency::Off => {}
                Latency::Endpoint => {
                    terms.clear();
                    terms.push(term("endpoint".into(), id, TermPart::Endpoint));
                }
                // before the endpointer, a stage is not on the turn's path
                Latency::Service | Latency::FirstOutput(_) if terms.is_empty() => {}
                Latency::Service => {
                    terms.push(term(format!("{id}_queue"), id, TermPart::Queue));
                    terms.push(term(id.to_string(), id, TermPart::Service));
                }
                Latency::FirstOutput(what) => {
                    terms.push(term(format!("{id}_queue"), id, TermPart::Queue));
                    terms.push(term(
                        format!("{id}_first_{what}"),
                        id,
                        TermPart::FirstOutput,
                    ));
                    terms.push(term("commit_wait".into(), id, TermPart::CommitWait));
                    return terms;
                }
            }
        }
        Vec::new()
    }

    /// The stages that own a queue term (their service or first output is
    /// on the response's critical path), in flow order.
    #[must_use]
    pub fn latency_stages(&self) -> Vec<&StageSpec> {
        let terms = self.latency_terms();
        self.stages
            .iter()
            .filter(|s| {
                terms
                    .iter()
                    .any(|t| t.stage == s.id && t.part == TermPart::Queue)
            })
            .collect()
    }

    /// Inserts stage `id` right after stage `after`, on the edge `after`
    /// writes: `after` now writes `output` instead, which `id` reads, and
    /// `id` writes what `after` wrote; it owns [`Latency::Service`]. Declare `output` with
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
                latency: Latency::Service,
            },
        );
        self
    }

    /// Adds stage `id` in front of `before`: it reads what `before` read,
    /// and `before` now reads its output, edge `input` (declared with
    /// [`Topology::edge`]). Its latency term is [`Latency::Off`]: a stage
    /// in front of the endpointer works on the audio, not on turns. No
    /// change when `before` is not a stage.
    #[must_use]
    pub fn insert_before(mut self, before: &StageId, id: StageId, input: EdgeId) -> Self {
        let Some(i) = self.stages.iter().position(|s| &s.id == before) else {
            return self;
        };
        let old = std::mem::replace(&mut self.stages[i].input, input.clone());
        self.stages.insert(
            i,
            StageSpec {
                id,
                input: old,
                output: Some(input),
                latency: Latency::Off,
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
    fn the_latency_terms_follow_the_declaration_up_to_the_first_output() {
        const MID: StageId = StageId::new("mid");
        let mid_in = EdgeId::owned("mid_in".into());
        let t = line()
            .latency(&ONE, Latency::Endpoint)
            .latency(&END, Latency::FirstOutput("token"));
        let names = |t: &Topology| -> Vec<String> {
            t.latency_terms().into_iter().map(|t| t.name).collect()
        };
        assert_eq!(
            names(&t),
            ["endpoint", "end_queue", "end_first_token", "commit_wait"]
        );
        // an inserted stage owns its queue and its service
        let t = t
            .edge(mid_in.clone(), 2, FullPolicy::Block)
            .insert_after(&ONE, MID, mid_in);
        assert_eq!(
            names(&t),
            [
                "endpoint",
                "mid_queue",
                "mid",
                "end_queue",
                "end_first_token",
                "commit_wait"
            ]
        );
        let parts: Vec<TermPart> = t.latency_terms().iter().map(|t| t.part).collect();
        assert_eq!(
            parts,
            [
                TermPart::Endpoint,
                TermPart::Queue,
                TermPart::Service,
                TermPart::Queue,
                TermPart::FirstOutput,
                TermPart::CommitWait
            ]
        );
        let on_path: Vec<&str> = t.latency_stages().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(on_path, ["mid", "end"]);
        // an undeclared stage is a no-op; a stage off the path owns nothing
        let off = t
            .clone()
            .latency(&MID, Latency::Off)
            .latency(&StageId::new("x"), Latency::Off);
        assert_eq!(
            names(&off),
            ["endpoint", "end_queue", "end_first_token", "commit_wait"]
        );
        // no first output: no response latency to decompose
        assert!(line().latency_terms().is_empty());
        assert_eq!(line().stages()[1].latency, Latency::Off, "a sink");
    }

    #[test]
    fn ids_compare_with_the_names_runs_carry() {
        assert_eq!(ONE, "one");
        assert_eq!(String::from("one"), ONE);
        assert_eq!(ONE.to_string(), "one");
        assert_ne!(END, *"one");
    }
}
