//! Scorers on hand-made cases.

use glance_world::score::{description_prf_text, normalize, parse_objects, prf};
use glance_world::{description_prf, exact_match, Colour, Object, Position, Shape, Size};

#[test]
fn normalisation() {
    assert_eq!(normalize("  The Red. "), "red");
    assert_eq!(normalize("Three"), "3");
    assert!(exact_match("three", "3"));
    assert!(exact_match("Yes.", "yes"));
    assert!(exact_match("a large red circle", "Large red circle!"));
    assert!(exact_match("top   left", "Top left"));
    assert!(exact_match("centre", "center"));
    assert!(exact_match("Zero.", "0"));
    assert!(!exact_match("no", "yes"));
    assert!(!exact_match("42", "24"));
    assert_eq!(normalize(""), "");
    assert_eq!(normalize("?!"), "");
}

fn obj(size: Size, colour: Colour, shape: Shape, position: Position) -> Object {
    let (cx, cy) = position.cell_center();
    Object {
        colour,
        shape,
        size,
        position,
        cx,
        cy,
    }
}

fn reference() -> Vec<Object> {
    vec![
        obj(Size::Large, Colour::Red, Shape::Circle, Position::TopLeft),
        obj(Size::Small, Colour::Blue, Shape::Square, Position::Center),
        obj(
            Size::Small,
            Colour::Blue,
            Shape::Square,
            Position::BottomRight,
        ),
    ]
}

#[test]
fn perfect_description_in_any_order() {
    let r = reference();
    let text = "There are 3 objects. In the bottom right there is a small blue square. \
                A small blue square is in the center. The top left has a large red circle.";
    let p = description_prf(text, &r);
    assert_eq!(
        (p.precision, p.recall, p.f1, p.true_positives),
        (1.0, 1.0, 1.0, 3)
    );
    let list = "The objects are a small blue square in the center, a large red circle in the top left \
                and a small blue square in the bottom right. A sign in the top right shows the number 42.";
    assert_eq!(description_prf(list, &r).f1, 1.0);
}

#[test]
fn duplicates_missing_and_extra_objects() {
    let r = reference();
    // Duplicate: the same object twice only matches once.
    let dup = "A large red circle is in the top left. A large red circle is in the top left.";
    let p = description_prf(dup, &r);
    assert_eq!((p.true_positives, p.predicted, p.reference), (1, 2, 3));
    assert!((p.precision - 0.5).abs() < 1e-12 && (p.recall - 1.0 / 3.0).abs() < 1e-12);
    // Missing: one right, nothing wrong.
    let p = description_prf("A small blue square is in the center.", &r);
    assert_eq!((p.precision, p.true_positives), (1.0, 1));
    assert!((p.f1 - 0.5).abs() < 1e-12);
    // Extra / wrong field: colour wrong → not a match; wrong position → not a match.
    let p = description_prf(
        "A large green circle is in the top left. A small blue square is in the top right. \
         A large red circle is in the top left.",
        &r,
    );
    assert_eq!((p.true_positives, p.predicted), (1, 3));
    // Missing fields never match.
    let p = description_prf("There is a red circle in the top left.", &r);
    assert_eq!(p.true_positives, 0);
    // Nothing predicted.
    let p = description_prf("I do not know.", &r);
    assert_eq!((p.precision, p.recall, p.f1), (0.0, 0.0, 0.0));
    assert_eq!(prf(&[], &[]).f1, 1.0);
}

#[test]
fn parser_handles_varied_phrasing() {
    let o = parse_objects(
        "At the middle right is a big orange star; a tiny purple cross sits in the upper left",
    );
    assert_eq!(o.len(), 2);
    assert_eq!(
        (o[0].size, o[0].colour, o[0].shape, o[0].position),
        (
            Some(Size::Large),
            Some(Colour::Orange),
            Shape::Star,
            Some(Position::MiddleRight)
        )
    );
    assert_eq!(
        (o[1].size, o[1].colour, o[1].shape, o[1].position),
        (
            Some(Size::Small),
            Some(Colour::Purple),
            Shape::Cross,
            Some(Position::TopLeft)
        )
    );
    let o =
        parse_objects("a small red triangle in the centre and a large green circle at the bottom");
    assert_eq!(o[0].position, Some(Position::Center));
    assert_eq!(o[1].position, Some(Position::BottomCenter));
    assert_eq!(
        description_prf_text(
            "a small red triangle in the center",
            "A small red triangle is in the center."
        )
        .f1,
        1.0
    );
}
