import { generateText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
const base = process.env.BASE, model = process.env.MODEL || 'tiny-think';
const openai = createOpenAI({ baseURL: base + '/v1', apiKey: 'iop-demo-key' });
const anthropic = createAnthropic({ baseURL: base + '/v1', apiKey: 'iop-demo-key' });
const show = (n, r) => console.log(n, JSON.stringify(r.text), 'reasoning:', JSON.stringify(r.reasoningText));
try { show('chat', await generateText({ model: openai.chat(model), prompt: 'Say hello.', providerOptions: { openai: { reasoningEffort: 'low' } } })); } catch (e) { console.log('chat error', e.message); }
try { show('responses', await generateText({ model: openai.responses(model), prompt: 'Say hello.', providerOptions: { openai: { reasoningEffort: 'low', reasoningSummary: 'auto' } } })); } catch (e) { console.log('responses error', e.message); }
try { show('messages', await generateText({ model: anthropic(model), prompt: 'Say hello.', maxOutputTokens: 2048, providerOptions: { anthropic: { thinking: { type: 'enabled', budgetTokens: 1024 } } } })); } catch (e) { console.log('messages error', e.message); }
