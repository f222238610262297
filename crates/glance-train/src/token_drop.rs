//! Visual-token drop augmentation for the QA stages: a share of the training images is shown to
//! the decoder through a pre-LLM pruning policy at a reduced budget, so the model learns to answer
//! from the token subsets (or merged tokens) that `--prune` hands it at inference.
//!
//! The pruned training sequence is built exactly like [`glance_prune::prefill_llava`] builds the
//! inference prompt: the policy (the same [`glance_prune::Pruner`] code) chooses `k` rows from the
//! projected tokens, the vision tower's [CLS] signals and the question's embeddings; the other
//! image rows are removed from the packed sequence; kept rows keep their original position ids and
//! so does the text after the image ([`Packed::keep_rows`]). A model trained only on complete
//! token sets is brittle to any selection that changes the mix of tokens; this closes that gap for
//! every pre-LLM policy alike — each is drawn equally often.
//!
//! Every draw is a pure function of the image's seed, so runs stay deterministic and resumable.

use crate::packing::Packed;
use crate::{Result, TrainError};
use candle_core::Tensor;
use glance_core::Rng;
use glance_models::llava::{ImageEncoding, Llava};
use glance_nn::CausalLm;
use glance_prune::{llava_input, select, Budget, Policy, PruneSpec};
use serde::{Deserialize, Serialize};

/// Stream of the drop draws (distinct from every other use of an image's seed).
const DROP_STREAM: &str = "glance-train/token-drop";

/// The augmentation's settings (saved with the stage in checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenDrop {
    /// Share of training images shown a pruned token set, in `[0, 1]`.
    pub fraction: f64,
    /// Budgets drawn uniformly, as ratios of the image's tokens in `(0, 1)`.
    pub budgets: Vec<f64>,
    /// Pre-LLM policies drawn uniformly, by name.
    pub policies: Vec<String>,
}

impl TokenDrop {
    /// Every pre-LLM policy at the budgets `glance bench prune` measures below 100%.
    pub fn every_policy(fraction: f64) -> Self {
        Self {
            fraction,
            budgets: vec![0.5, 0.25, 0.125, 0.0625],
            policies: Policy::ALL
                .iter()
                .filter(|p| p.stage() == glance_prune::Stage::PreLlm)
                .map(|p| p.name().to_string())
                .collect(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainError::Config(format!("token drop: {m}")));
        if !(0.0..=1.0).contains(&self.fraction) {
            return bad(format!(
                "the fraction must be in [0, 1], got {}",
                self.fraction
            ));
        }
        if self.budgets.is_empty() || self.policies.is_empty() {
            return bad("needs at least one budget and one policy".into());
        }
        if let Some(b) = self.budgets.iter().find(|b| !(**b > 0.0 && **b < 1.0)) {
            return bad(format!("budgets must be ratios in (0, 1), got {b}"));
        }
        for p in &self.policies {
            let policy: Policy = p.parse().map_err(|e| TrainError::Config(format!("{e}")))?;
            if policy.stage() != glance_prune::Stage::PreLlm {
                return bad(format!("`{p}` is not a pre-LLM policy"));
            }
        }
        Ok(())
    }

    /// What to do with the image of seed `image_seed` whose first question has query ids
    /// `query`: `None` keeps every token.
    pub fn plan(&self, image_seed: u64, query: Vec<u32>) -> Result<Option<DropPlan>> {
        let mut rng = Rng::for_name(image_seed, DROP_STREAM);
        if rng.next_f64() >= self.fraction {
            return Ok(None);
        }
        let pick = |rng: &mut Rng, n: usize| (rng.next_u64() % n as u64) as usize;
        let policy = self.policies[pick(&mut rng, self.policies.len())]
            .parse::<Policy>()
            .map_err(|e| TrainError::Config(format!("{e}")))?;
        let keep = self.budgets[pick(&mut rng, self.budgets.len())];
        let mut spec = PruneSpec::new(policy, Budget::Ratio(keep));
        spec.seed = rng.next_u64();
        Ok(Some(DropPlan { spec, query }))
    }
}

/// One image's drop: the pruning request and the query the policy reads (the first packed
/// question; the other questions about the image see the same subset, as a second question of a
/// dialogue would).
#[derive(Debug, Clone)]
pub struct DropPlan {
    pub spec: PruneSpec,
    pub query: Vec<u32>,
}

impl DropPlan {
    /// The share of the image's tokens kept.
    pub fn keep_ratio(&self) -> f64 {
        match self.spec.budget {
            Budget::Ratio(r) => r,
            Budget::Count(_) => 1.0,
        }
    }
}

/// What a drop keeps of one image's rows.
pub struct Kept {
    /// The image's rows to the decoder `(prefix + k, text_hidden)`: the rows before the patch
    /// tokens (if the layout has any), then the policy's (possibly merged) rows.
    pub rows: Tensor,
    /// Index of each kept row among the image's rows, increasing.
    pub index: Vec<usize>,
}

/// Runs `plan`'s policy on one image: `model` embeds the query and gives the config, `enc` holds
/// the image's projected tokens (with their gradient), the tower's features and [CLS] attention.
pub fn select_rows(model: &Llava, enc: &ImageEncoding, plan: &DropPlan) -> Result<Kept> {
    let pruner = plan.spec.pruner().ok_or_else(|| {
        TrainError::Config(format!("`{}` has no pre-LLM selector", plan.spec.policy))
    })?;
    let query = if plan.spec.policy.uses_query() && !plan.query.is_empty() {
        Some(model.text().embed_tokens(&plan.query)?.detach())
    } else {
        None
    };
    let (prefix, input) = llava_input(model, enc, query)?;
    let n = input.len()?;
    let k = plan
        .spec
        .budget
        .resolve(n + prefix)
        .saturating_sub(prefix)
        .max(1);
    let kept = select(pruner.as_ref(), &input, k)?;
    let index = (0..prefix)
        .chain(kept.index.iter().map(|&i| prefix + i))
        .collect();
    let rows = if prefix > 0 {
        Tensor::cat(&[enc.features.narrow(0, 0, prefix)?, kept.rows], 0)?
    } else {
        kept.rows
    };
    Ok(Kept { rows, index })
}

/// Applies `plan` to one image of a packed sequence ([`select_rows`]). Returns the kept rows
/// `(k, text_hidden)` and `packed` without the dropped image rows.
pub fn apply(
    model: &Llava,
    enc: &ImageEncoding,
    packed: &Packed,
    image_token_id: u32,
    plan: &DropPlan,
) -> Result<(Tensor, Packed)> {
    let kept = select_rows(model, enc, plan)?;
    let start = packed
        .ids
        .iter()
        .position(|&i| i == image_token_id)
        .ok_or_else(|| TrainError::Config("a packed sequence has no image tokens".into()))?;
    let n = enc.features.dim(0)?;
    let image = start..start + n;
    let mut rows: Vec<usize> = (0..packed.len())
        .filter(|r| !image.contains(r))
        .chain(kept.index.iter().map(|&i| image.start + i))
        .collect();
    rows.sort_unstable();
    Ok((kept.rows, packed.keep_rows(&rows)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_deterministic_and_follow_the_fraction() {
        let d = TokenDrop::every_policy(0.6);
        d.validate().unwrap();
        assert_eq!(d.policies.len(), 7, "{:?}", d.policies);
        let plans: Vec<_> = (0..2000u64)
            .map(|s| d.plan(s, vec![1, 2]).unwrap())
            .collect();
        let dropped = plans.iter().filter(|p| p.is_some()).count();
        assert!((1050..1350).contains(&dropped), "{dropped} of 2000");
        let again = d.plan(7, vec![]).unwrap().map(|p| p.spec);
        assert_eq!(again, plans[7].as_ref().map(|p| p.spec.clone()));
        for name in &d.policies {
            let p: Policy = name.parse().unwrap();
            assert!(plans.iter().flatten().any(|q| q.spec.policy == p), "{name}");
        }
        assert!(TokenDrop::every_policy(0.0)
            .plan(3, vec![])
            .unwrap()
            .is_none());
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut d = TokenDrop::every_policy(0.5);
        d.policies.push("fastv".into());
        assert!(d.validate().unwrap_err().to_string().contains("fastv"));
        let mut d = TokenDrop::every_policy(1.5);
        assert!(d.validate().is_err());
        d.fraction = 0.5;
        d.budgets = vec![1.0];
        assert!(d.validate().is_err());
    }
}
