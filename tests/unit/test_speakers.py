"""Who said a turn, and whether a query names them (memory.speakers)."""

from __future__ import annotations

import pytest

from memory.speakers import named, query_words, speaker_ranks, speakers_field


@pytest.mark.parametrize(
    ("text", "role", "field"),
    [
        ("Caroline: Yes, yesterday!", "user", "user|caroline"),
        ("Dr. Lee: the scan is clear", "assistant", "assistant|dr lee"),
        ("planner-7: rolled back the deploy", "planner", "planner|planner 7"),
        ("Caroline:no space after the colon", "user", "user"),
        ("See https://example.com: it says so", "assistant", "assistant"),  # "://" is no label's colon
        ("Yes, yesterday!", "assistant", "assistant"),
        ("A: B", "", ""),  # a marker, not a name
        ("Re: the invoice", "user", "user"),
        ("\u5f20\u4f1f\uff1a\u4f60\u597d", "user", "user|\u5f20\u4f1f"),  # a full-width colon
        ("Zoe\u0308: hi", "", "zoë"),  # decomposed: read as its composed form
        ("O\u2019Brien: done", "user", "user|o\u2019brien"),
        ("user: hello", "user", "user"),  # the same speaker once
        ("", "", ""),
    ],
)
def test_a_turns_speakers_are_its_role_and_the_name_it_opens_with(text: str, role: str, field: str) -> None:
    assert speakers_field(text, role) == field


def test_what_an_agent_said_itself_is_said_by_its_agent_id() -> None:
    """An ``assistant`` turn is the agent's own: "what did planner-7 say" names it. A user's
    turn in the agent's session is not the agent's."""
    assert speakers_field("Raised the pool to 40.", "assistant", "planner-7") == "assistant|planner 7"
    assert speakers_field("Dr. Lee: the scan is clear", "assistant", "dr lee") == "assistant|dr lee"
    assert speakers_field("The pool ran dry again.", "user", "planner-7") == "user"
    assert named(speakers_field("Raised the pool.", "assistant", "planner-7"), query_words("What did planner-7 say?"))


def test_a_query_names_a_speaker_by_all_of_its_words_in_order() -> None:
    words = query_words("What did Dr. Lee say about the scan? And Nate?")
    assert named("assistant|dr lee", words)
    assert named("user|nate", words)
    assert not named("user|lee dr", words)  # out of order
    assert not named("user|nat", words)  # a word, not a prefix
    assert not named("", words)


def test_the_speaker_list_ranks_the_named_speakers_turns_first_and_no_other() -> None:
    hits = [("t1", "user|caroline"), ("t2", "assistant|melanie"), ("t3", ""), ("d1", "")]
    assert speaker_ranks("What did Melanie paint?", hits) == {"t2": 1}
    assert speaker_ranks("what did the user ask for", hits) == {"t1": 1}
    assert speaker_ranks("sunset painting", hits) == {}


def test_a_question_in_the_first_person_names_the_user_and_in_the_second_the_assistant() -> None:
    hits = [("u", "user|caroline"), ("a", "assistant|melanie"), ("doc", "")]
    assert speaker_ranks("What did I say about the move?", hits) == {"u": 1}
    assert speaker_ranks("Where's my passport?", hits) == {"u": 1}
    assert speaker_ranks("I'm lost: which hotel?", hits) == {"u": 1}
    assert speaker_ranks("What did you recommend?", hits) == {"a": 1}
    # Both at once say who asks, not whom it is about; a name still counts.
    assert speaker_ranks("Can you tell me what I said?", hits) == {}
    assert speaker_ranks("Can you tell me what Melanie said?", hits) == {"a": 1}
    # A word that holds "i" or "you" is no pronoun.
    assert speaker_ranks("Is the wifi down in Youngstown?", hits) == {}
    # A phone's apostrophe splits as a typed one does.
    assert speaker_ranks("I\u2019m lost: which hotel?", hits) == {"u": 1}
    assert speaker_ranks("you\u2019re sure?", hits) == {"a": 1}
    # The role never joins the question's last word into another speaker's name.
    assert speaker_ranks("What did you say about research", [("r", "user|research assistant")]) == {}
